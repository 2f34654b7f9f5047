"""The MLE tasks' grader (tools/make_mle.py copies it into every task as tests/grade.py).

Reads /tests/config.json (metric, target, classes, baseline, reference), the hidden labels
/tests/answers.csv and the agent's /app/submission.csv, and writes /logs/verifier/reward.json:
``reward`` (the normalized score: 0 at the baseline, 1 at or above the reference, clipped to
[0, 1]), the raw metric under its own name (``accuracy`` or ``rmse``), and ``submitted``.

- No submission file: reward 0, ``submitted`` 0 (the agent wrote nothing; nothing to grade).
- A malformed submission (no ``id`` or target column, missing / duplicate / unknown ids, a value
  that is not a number or not a known class): NO reward file, the reason on stderr, exit 2: the
  run records a verifier failure (VERIFIER_NO_REWARD) with that reason, never a 0.

Standard library only, so the verifier needs nothing but python3.
"""

from __future__ import annotations

import csv
import json
import math
import sys
from pathlib import Path

CONFIG = Path("/tests/config.json")
ANSWERS = Path("/tests/answers.csv")
SUBMISSION = Path("/app/submission.csv")
REWARD = Path("/logs/verifier/reward.json")


class Rejected(ValueError):
    """A submission that cannot be graded; the message says why."""


def read_rows(path: Path, target: str) -> dict[str, str]:
    """id -> target value of a CSV with (at least) the columns `id` and `target`."""
    with path.open(newline="", encoding="utf-8-sig") as f:
        reader = csv.DictReader(f)
        header = [h.strip() for h in reader.fieldnames or []]
        missing = [c for c in ("id", target) if c not in header]
        if missing:
            raise Rejected(f"{path}: no column {missing} (header: {header}; need id,{target})")
        reader.fieldnames = header
        rows: dict[str, str] = {}
        for i, row in enumerate(reader, start=2):
            key = (row["id"] or "").strip()
            if key in rows:
                raise Rejected(f"{path} line {i}: id {key!r} appears twice")
            rows[key] = (row[target] or "").strip()
    return rows


def canonical(value: str, classes: list[str]) -> str:
    """A predicted class as the answers spell it ("3.0" is class "3" when classes are ints)."""
    if value in classes:
        return value
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if number.is_integer() and str(int(number)) in classes:
        return str(int(number))
    raise Rejected(f"{value!r} is not a class; the classes are {classes}")


def number(value: str, key: str) -> float:
    try:
        x = float(value)
    except ValueError:
        raise Rejected(f"id {key!r}: {value!r} is not a number") from None
    if not math.isfinite(x):
        raise Rejected(f"id {key!r}: {value!r} is not finite")
    return x


def metric(config: dict, truth: dict[str, str], pred: dict[str, str]) -> float:
    """Accuracy or RMSE of `pred` against `truth` (same ids); Rejected if `pred` cannot be read."""
    missing = sorted(set(truth) - set(pred))
    extra = sorted(set(pred) - set(truth))
    if missing or extra:
        raise Rejected(
            f"the submission's ids differ from the test set's: {len(missing)} missing "
            f"{missing[:5]}, {len(extra)} unknown {extra[:5]} (need one row per test id)"
        )
    if config["metric"] == "accuracy":
        classes = [str(c) for c in config["classes"]]
        hits = sum(canonical(pred[k], classes) == v for k, v in truth.items())
        return hits / len(truth)
    se = sum((number(pred[k], k) - float(v)) ** 2 for k, v in truth.items())
    return math.sqrt(se / len(truth))


def normalized(config: dict, raw: float) -> float:
    """0 at the baseline, 1 at or above the reference, linear between, clipped to [0, 1]."""
    base, ref = config["baseline"], config["reference"]
    score = (raw - base) / (ref - base)  # both metrics: (ref - base) carries the direction
    return min(1.0, max(0.0, score))


def grade(config: dict, answers: Path, submission: Path) -> dict[str, float]:
    """The reward.json metrics of `submission`; Rejected if it is malformed."""
    if not submission.is_file():
        return {"reward": 0.0, "submitted": 0.0}
    truth = read_rows(answers, config["target"])
    raw = metric(config, truth, read_rows(submission, config["target"]))
    return {"reward": normalized(config, raw), config["metric"]: raw, "submitted": 1.0}


def main() -> int:
    config = json.loads(CONFIG.read_text())
    try:
        metrics = grade(config, ANSWERS, SUBMISSION)
    except (Rejected, csv.Error, UnicodeDecodeError) as exc:
        print(f"submission rejected: {exc}", file=sys.stderr)
        return 2
    REWARD.parent.mkdir(parents=True, exist_ok=True)
    REWARD.write_text(json.dumps(metrics))
    print(json.dumps(metrics))
    return 0


if __name__ == "__main__":
    sys.exit(main())
