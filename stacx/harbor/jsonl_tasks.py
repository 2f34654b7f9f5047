"""Task sets as JSON lines (what `stacx tasks prepare` writes), and the light answer-task format,
one ``{"id", "problem", "answer", "difficulty"?}`` per line.
"""

from __future__ import annotations

import os
from pathlib import Path

import msgspec

from stacx.errors import TaskError
from stacx.harbor.model import AgentConfig, EnvironmentConfig, Task, TaskConfig, VerifierConfig

_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(Task)


def write_jsonl(tasks: list[Task], output: str | Path) -> None:
    """Write tasks, one JSON object per line (atomically: a temp file renamed into place)."""
    output = Path(output)
    tmp = output.with_name(output.name + f".tmp{os.getpid()}")
    with tmp.open("wb") as f:
        for t in tasks:
            f.write(_encoder.encode(t) + b"\n")
    tmp.replace(output)


ANSWER_PATH = "/logs/agent/answer.txt"  # where an answer task's agent writes its final answer


class AnswerRecord(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One line of the light answer-task format (see the module docstring)."""

    id: str
    problem: str
    answer: str | int | float
    difficulty: str | None = None


_answer_decoder = msgspec.json.Decoder(AnswerRecord)


def answer_task(record: AnswerRecord, source: str | Path) -> Task:
    """The `Task` of one answer record of `source` (an absolute .jsonl path is kept as is)."""
    answer = record.answer if isinstance(record.answer, str) else repr(record.answer)
    metadata: dict[str, object] = {"answer": answer, "answer_path": ANSWER_PATH}
    if record.difficulty is not None:
        metadata["difficulty"] = record.difficulty
    return Task(
        task_id=record.id,
        path=f"{Path(source).resolve()}#{record.id}",
        instruction=record.problem,
        config=TaskConfig(
            metadata=metadata,
            verifier=VerifierConfig(timeout_sec=30.0),
            agent=AgentConfig(timeout_sec=600.0),
            environment=EnvironmentConfig(cpus=1.0, memory_mb=1024, allow_internet=False),
        ),
    )


def read_jsonl(path: str | Path) -> list[Task]:
    """A tasks.jsonl (`write_jsonl`'s) or a file of answer records; TaskError naming a bad line."""
    tasks = []
    for lineno, line in enumerate(Path(path).read_bytes().splitlines(), 1):
        if not line.strip():
            continue
        try:
            if b'"problem"' in line and b'"task_id"' not in line:
                tasks.append(answer_task(_answer_decoder.decode(line), path))
            else:
                tasks.append(_decoder.decode(line))
        except msgspec.DecodeError as exc:
            raise TaskError(f"{path}:{lineno}: not a task record: {exc}") from exc
    return tasks
