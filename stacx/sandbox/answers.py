"""The verifier of answer tasks (the light .jsonl math format): the agent's final answer, read from
the task's `answer_path`, compared with the reference (1.0 or 0.0), in the caller's process.
`normalize_answer` and `answers_match` are pure and never raise; no answer scores 0.0.

Design: docs/tasks.md#answer-tasks
"""

from __future__ import annotations

import re
import time
from fractions import Fraction

from stacx.errors import SandboxError, TaskError
from stacx.events import FailureKind
from stacx.ports import Sandbox, Task
from stacx.sandbox.verifier import VerifierFailure, VerifierOutcome, VerifierResult

_BOXED = re.compile(r"^\\(?:boxed|fbox)\s*\{(.*)\}$", re.DOTALL)
_FRAC = re.compile(r"\\[dt]?frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}")
_TEXT = re.compile(r"\\(?:text|textbf|mathrm|mbox)\s*\{([^{}]*)\}")
_THOUSANDS = re.compile(r"^[+-]?\d{1,3}(,\d{3})+(\.\d+)?$")
_ASSIGN = re.compile(r"^[a-zA-Z]\s*=\s*(?=\S)")
_NUMBER = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)(e[+-]?\d+)?$", re.IGNORECASE)
_RATIO = re.compile(r"^([+-]?\d+)/([+-]?\d+)$")


def normalize_answer(text: str) -> str:
    """A reduced fraction ("3/4", "-2") for a rational answer, else its text without formatting."""
    boxed = _BOXED.match(text.strip())  # a \boxed{...} wrapping the whole of it
    s = (boxed.group(1) if boxed else text.strip()).strip()
    s = s.replace("\u2212", "-").replace("$", "").replace("\\!", "").replace("\\,", "")
    s = s.replace("\\left", "").replace("\\right", "").replace("\\%", "%")
    s = _TEXT.sub(r"\1", s)
    s = _FRAC.sub(r"(\1)/(\2)", s)
    s = s.strip().rstrip(".").strip()
    s = _ASSIGN.sub("", s)
    value = _rational(s)
    if value is not None:
        return str(value)
    return re.sub(r"\s+", "", s).lower()


def _rational(s: str) -> Fraction | None:
    """`s` as an exact rational, if it is one written plainly (see `normalize_answer`)."""
    s = s.replace(" ", "")
    if _THOUSANDS.match(s):
        s = s.replace(",", "")
    # "(3)/(4)" from a \frac, or a parenthesized number
    s = re.sub(r"\(([+-]?[\d.]+)\)", r"\1", s)
    if _NUMBER.match(s):
        return Fraction(s)
    m = _RATIO.match(s)
    if m and int(m.group(2)) != 0:
        return Fraction(int(m.group(1)), int(m.group(2)))
    if "/" in s:
        num, _, den = s.partition("/")
        if _NUMBER.match(num) and _NUMBER.match(den) and Fraction(den) != 0:
            return Fraction(num) / Fraction(den)
    return None


def answers_match(given: str, expected: str) -> bool:
    """Whether `given` is the same answer as `expected` (numerically where both are rationals)."""
    g, e = normalize_answer(given), normalize_answer(expected)
    return bool(g) and g == e


def answer_reward(given: str | None, expected: str) -> float:
    """1.0 on a match, else 0.0 (also when there is no answer at all)."""
    return 1.0 if given is not None and answers_match(given, expected) else 0.0


def is_answer_task(task: Task) -> bool:
    """A task from the light math format, scored by `verify_answer` (not by a test.sh)."""
    return "answer" in task.config.metadata and "answer_path" in task.config.metadata


async def verify_answer(sandbox: Sandbox, task: Task) -> VerifierOutcome:
    """Score the agent's answer file; SandboxError reading it is EXEC_TRANSPORT."""
    meta = task.config.metadata
    if not is_answer_task(task):
        raise TaskError(f"{task.task_id}: not an answer task (no metadata.answer / answer_path)")
    t0 = time.perf_counter()
    try:
        given: str | None = (await sandbox.read_file(str(meta["answer_path"]))).decode(
            "utf-8", errors="replace"
        )
    except (FileNotFoundError, IsADirectoryError):
        given = None
    except (SandboxError, OSError) as exc:
        return VerifierFailure(
            kind=FailureKind.EXEC_TRANSPORT,
            reason=f"reading the answer: {exc}",
            duration_ms=(time.perf_counter() - t0) * 1000,
        )
    reward = answer_reward(given, str(meta["answer"]))
    metrics = {"reward": reward, "answered": 0.0 if given is None else 1.0}
    return VerifierResult(
        reward=reward,
        metrics=metrics,
        duration_ms=(time.perf_counter() - t0) * 1000,
        output="" if given is None else given[:200],
    )
