"""Rubrics: criteria a judge model scores, and how its score meets the verifier's reward (Harbor
RewardKit's judge files plus STACX's ``[combine]``). Pure: parsing (errors name the file and key
path), prompts, reply parsing, aggregation, combination; asking a model is `stacx.judge`. An
unparseable reply is never a 0.
Design: docs/judges.md#the-rubric-file
"""

from __future__ import annotations

import math
import re
import tomllib
from pathlib import Path
from typing import Literal

import msgspec

from stacx.errors import TaskError

CriterionType = Literal["binary", "likert", "numeric"]
Aggregation = Literal["weighted_mean", "all_pass", "any_pass", "threshold"]
Rule = Literal["weighted_sum", "min", "verifier_gated"]
Mode = Literal["batched", "individual"]
PASS = 0.5  # a criterion passes (all_pass / any_pass) at this normalized score


class _Table(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Base of the rubric's tables: unknown keys are errors (a typo is not silently ignored)."""


class JudgeSettings(_Table, frozen=True, kw_only=True):
    judge: str = ""
    files: list[str] = msgspec.field(default_factory=list)
    mode: Mode = "batched"
    decoding: Literal["generate", "choices"] = "generate"
    reference: str = ""
    max_new_tokens: int = 48
    temperature: float = 0.0
    retries: int = 2
    retry_temperature: float = 0.7
    max_answer_chars: int = 6000


class Criterion(_Table, frozen=True, kw_only=True):
    description: str
    name: str = ""
    type: CriterionType = "binary"
    points: int = 5  # likert
    min: float = 0.0  # numeric
    max: float = 1.0  # numeric
    weight: float = 1.0


class Scoring(_Table, frozen=True, kw_only=True):
    aggregation: Aggregation = "weighted_mean"
    threshold: float = 0.7


class Combine(_Table, frozen=True, kw_only=True):
    rule: Rule = "weighted_sum"
    weights: dict[str, float] = msgspec.field(
        default_factory=lambda: {"verifier": 0.5, "judge": 0.5}
    )
    gate: float = 1.0


class Rubric(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One parsed rubric file; `path` is where it was read (recorded with each judge call)."""

    judge: JudgeSettings = msgspec.field(default_factory=JudgeSettings)
    criterion: list[Criterion] = msgspec.field(default_factory=list)
    scoring: Scoring = msgspec.field(default_factory=Scoring)
    combine: Combine = msgspec.field(default_factory=Combine)
    path: str = ""


_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]*$")


def parse_rubric(text: str, *, where: str) -> Rubric:
    """A rubric from TOML text; a TaskError naming `where` and the key path on any problem."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise TaskError(f"{where}: not valid TOML: {exc}") from exc
    if "path" in raw:
        raise TaskError(f"{where}: path: unknown key")
    crits = raw.get("criterion")
    if isinstance(crits, list):  # default names before validation, so they are checked too
        raw["criterion"] = [
            {"name": f"c{i}", **c} if isinstance(c, dict) and "name" not in c else c
            for i, c in enumerate(crits)
        ]
    try:
        rubric = msgspec.convert(raw, Rubric)
    except msgspec.ValidationError as exc:
        # msgspec: "Object contains unknown field `x` - at `$.criterion[0]`" / "Invalid enum ..."
        raise TaskError(f"{where}: {exc}") from exc
    _check(rubric, where)
    return msgspec.structs.replace(rubric, path=where)


def load_rubric(path: str | Path) -> Rubric:
    """`parse_rubric` of a file; an unreadable file is a TaskError naming it."""
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise TaskError(f"{path}: cannot read the rubric: {exc}") from exc
    return parse_rubric(text, where=str(path))


def task_rubric(task_dir: Path, declared: str | None, *, where: str) -> Rubric | None:
    """The rubric a task.toml declares (``[verifier.stacx] rubric``, relative to the task
    directory), parsed; None when it declares none."""
    if declared is None:
        return None
    path = task_dir / declared
    if not path.is_file():
        raise TaskError(f"{where}: verifier.stacx.rubric = {declared!r}: no such file ({path})")
    return load_rubric(path)


def _check(r: Rubric, where: str) -> None:
    """Values msgspec cannot check: each problem as ``file: key.path = value: why``."""
    out: list[str] = []
    if not r.criterion:
        out.append("criterion: at least one [[criterion]] is needed")
    names = [c.name for c in r.criterion]
    for i, c in enumerate(r.criterion):
        key = f"criterion[{i}]"
        if not _NAME.match(c.name):
            out.append(f"{key}.name = {c.name!r}: letters, digits, _ and -, starting with a letter")
        if not c.description.strip():
            out.append(f"{key}.description: empty")
        if c.weight < 0 or not math.isfinite(c.weight):
            out.append(f"{key}.weight = {c.weight}: must be a finite number >= 0")
        if c.type == "likert" and c.points < 2:
            out.append(f"{key}.points = {c.points}: a likert scale needs at least 2 points")
        if c.type == "numeric" and not c.max > c.min:
            out.append(f"{key}.min = {c.min}, max = {c.max}: need min < max")
        if c.type == "numeric" and r.judge.decoding == "choices":
            out.append(
                f"{key}.type = 'numeric': judge.decoding = 'choices' picks among the "
                "values of binary and likert criteria only (use 'generate')"
            )
    if len(set(names)) != len(names):
        out.append(f"criterion: names repeat: {names}")
    if r.criterion and sum(c.weight for c in r.criterion) <= 0:
        out.append("criterion[*].weight: all 0 (nothing to average)")
    j = r.judge
    if not j.files:
        out.append("judge.files: name at least one file the agent writes (what is judged)")
    if j.retries < 0 or j.max_new_tokens < 1 or j.max_answer_chars < 1:
        out.append("judge.retries >= 0, judge.max_new_tokens >= 1, judge.max_answer_chars >= 1")
    if j.temperature < 0 or j.retry_temperature < 0:
        out.append("judge.temperature, judge.retry_temperature: must be >= 0")
    if not 0.0 <= r.scoring.threshold <= 1.0:
        out.append(f"scoring.threshold = {r.scoring.threshold}: accepted values are in [0, 1]")
    comb = r.combine
    unknown = sorted(set(comb.weights) - {"verifier", "judge"})
    if unknown:
        out.append(f"combine.weights: {unknown} unknown; accepted keys: verifier, judge")
    bad = {k: w for k, w in comb.weights.items() if w < 0 or not math.isfinite(w)}
    if bad:
        out.append(f"combine.weights = {bad}: must be finite numbers >= 0")
    if comb.rule != "weighted_sum" and comb.weights != Combine().weights:
        out.append(f"combine.weights: used by rule 'weighted_sum' only (rule is {comb.rule!r})")
    if out:
        raise TaskError(f"{where}: " + "; ".join(out))


# ---- scores ------------------------------------------------------------------------------------

_YES = {"yes", "true", "pass", "passed", "1", "y", "correct"}
_NO = {"no", "false", "fail", "failed", "0", "n", "incorrect"}
_NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?")


def scale(c: Criterion) -> str:
    """How the judge is told to answer one criterion."""
    if c.type == "binary":
        return "yes or no"
    if c.type == "likert":
        return f"an integer from 1 to {c.points}"
    return f"a number from {c.min:g} to {c.max:g}"


def choices(c: Criterion) -> list[str]:
    """The values a judge picks from under ``decoding = "choices"`` (binary, likert)."""
    if c.type == "binary":
        return ["yes", "no"]
    return [str(i) for i in range(1, c.points + 1)]


def normalize(c: Criterion, value: str) -> float | None:
    """The judge's value for `c` in [0, 1] (RewardKit's normalization); None when off its scale."""
    word = value.strip().strip("*`'\".,;:!()[]").lower()
    if c.type == "binary":
        first = re.split(r"[\s,.;:!]+", word, maxsplit=1)[0] if word else ""
        return 1.0 if first in _YES else 0.0 if first in _NO else None
    m = _NUMBER.search(word)
    if m is None:
        return None
    raw = float(m.group())
    if c.type == "likert":
        if raw != int(raw) or not 1 <= raw <= c.points:
            return None
        return (raw - 1) / (c.points - 1)
    if not c.min <= raw <= c.max:
        return None
    return (raw - c.min) / (c.max - c.min)


def parse_reply(criteria: list[Criterion], reply: str) -> tuple[dict[str, float], str]:
    """``(scores, problem)`` from a reply of ``name: value`` lines (markdown allowed; the first line
    naming a criterion counts; a lone criterion may get a bare value); ``problem`` "" when every
    criterion got a value."""
    scores: dict[str, float] = {}
    missing: list[str] = []
    for c in criteria:
        pattern = rf"(?im)^[\s\-*#>]*\**{re.escape(c.name)}\**\s*[:=\-]\s*(.*)$"
        m = re.search(pattern, reply)
        value = m.group(1) if m else (reply if len(criteria) == 1 else None)
        got = None if value is None else normalize(c, value)
        if got is None:
            missing.append(f"{c.name} ({scale(c)})")
        else:
            scores[c.name] = got
    if missing:
        return scores, f"no usable value for {', '.join(missing)} in {reply.strip()[:200]!r}"
    return scores, ""


def aggregate(rubric: Rubric, scores: dict[str, float]) -> float:
    """The judge score in [0, 1] from every criterion's normalized score ([scoring])."""
    crits = rubric.criterion
    if rubric.scoring.aggregation == "all_pass":
        return float(all(scores[c.name] >= PASS for c in crits))
    if rubric.scoring.aggregation == "any_pass":
        return float(any(scores[c.name] >= PASS for c in crits))
    mean = sum(c.weight * scores[c.name] for c in crits) / sum(c.weight for c in crits)
    if rubric.scoring.aggregation == "threshold":
        return float(mean >= rubric.scoring.threshold)
    return mean


def combine(rule: Combine, verifier: float, judge: float) -> float:
    """The reward from the verifier's and the judge's ([combine]): weighted_sum (missing weights:
    0), min, or verifier_gated (the judge's score once the verifier reaches ``gate``, else its own).
    """
    if rule.rule == "min":
        return min(verifier, judge)
    if rule.rule == "verifier_gated":
        return judge if verifier >= rule.gate else verifier
    w = rule.weights
    return w.get("verifier", 0.0) * verifier + w.get("judge", 0.0) * judge


# ---- the prompt --------------------------------------------------------------------------------

SYSTEM = "You are a strict grader. You read a task and an answer and grade the answer."


def prompt_messages(
    rubric: Rubric, criteria: list[Criterion], instruction: str, answers: dict[str, str]
) -> list[dict[str, str]]:
    """One judge call's chat messages over `criteria`; `answers`: judged file -> its (cut) text."""
    cut = rubric.judge.max_answer_chars
    parts = [f"Task given to the agent:\n{instruction.strip()}\n"]
    for path, text in answers.items():
        body = text if len(text) <= cut else text[:cut] + "\n[... cut]"
        parts.append(f"The agent's answer ({path}):\n{body.strip() or '(empty file)'}\n")
    if rubric.judge.reference.strip():
        parts.append(f"A reference answer:\n{rubric.judge.reference.strip()}\n")
    lines = [f"- {c.name} ({scale(c)}): {c.description.strip()}" for c in criteria]
    parts.append(
        "Grade the agent's answer on each criterion. Reply with one line per criterion, "
        "exactly `name: value`, and nothing else.\n" + "\n".join(lines)
    )
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "\n".join(parts)}]


def reply_prefix(criteria: list[Criterion]) -> str:
    """The start of the judge's reply, put in its mouth so that even a small model answers ``name:
    value`` (the parsed reply is this prefix + the generation)."""
    return f"{criteria[0].name}:"
