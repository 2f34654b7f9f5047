"""The verifier of answer tasks (math sets in the light .jsonl format, see stacx.harbor.tasks):
normalize a final answer and compare it with the task's reference answer.

Reward: 1.0 when the agent's answer equals the reference, else 0.0. Equality is numeric where
both sides parse as exact rationals (integers, "1,000", "-3", "3/4", "0.75", "\\frac{3}{4}",
"7.0", "1.5e3"; so "3/4" == "0.75" and "7" == "7.0"), otherwise it is equality of the
normalized text (case, spaces, "$", "\\text{}", "\\left"/"\\right" dropped).

Where the answer comes from: the agent writes its final answer (the content of its last
``\\boxed{...}``) to the task's ``metadata.answer_path`` in the sandbox (stacx.agents.retool);
`verify_answer` reads that file, so the verifier needs no Docker, no test.sh and no
interpreter in the sandbox: it runs in the caller's process on the one file.

Guarantees: `normalize_answer` and `answers_match` are pure and never raise. An agent that gave
no answer (no file) scores 0.0 with metric ``answered = 0``: that is the agent's outcome, not an
infrastructure failure. Limits: no symbolic algebra (``2\\sqrt{2}`` equals only itself after
normalization, not ``\\sqrt{8}``); decimals compare exactly (``0.333`` is not ``1/3``); a
tuple, an interval or a percentage ("50%" is not 0.5) is compared as text.
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


def unbox(text: str) -> str:
    """`text` without a ``\\boxed{...}`` wrapping the whole of it (a reference answer written
    boxed); finding the answer in a reply is the agent's job (stacx.agents.retool)."""
    m = _BOXED.match(text)
    return m.group(1) if m else text


def normalize_answer(text: str) -> str:
    """A canonical string for `text`: a reduced fraction ("3/4", "-2", "1000") where the answer
    is a rational number, else the answer's text with formatting stripped (see module doc)."""
    s = unbox(text.strip()).strip()
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
    """Whether `given` is the same answer as `expected` (see the module docstring)."""
    g, e = normalize_answer(given), normalize_answer(expected)
    return bool(g) and g == e


def answer_reward(given: str | None, expected: str) -> float:
    """1.0 on a match, else 0.0 (also when there is no answer at all)."""
    return 1.0 if given is not None and answers_match(given, expected) else 0.0


def is_answer_task(task: Task) -> bool:
    """A task from the light math format, scored by `verify_answer` (not by a test.sh)."""
    return "answer" in task.config.metadata and "answer_path" in task.config.metadata


async def verify_answer(sandbox: Sandbox, task: Task) -> VerifierOutcome:
    """Read the agent's final answer from the sandbox and score it against the task's.

    What is infrastructure: a sandbox transport error while reading (EXEC_TRANSPORT); a task
    without a reference answer is a TaskError (it is not an answer task)."""
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
