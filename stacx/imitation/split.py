"""A deterministic train / held-out split of a task set.

A task goes to held-out iff the first 8 hex digits of ``sha256(seed:task_id)`` are below
``held_out_fraction * 2**32``: stable across machines, Python versions and task-set order, and
adding a task never moves another one.
"""

from __future__ import annotations

import hashlib


def is_held_out(task_id: str, *, held_out_fraction: float = 0.5, seed: int = 0) -> bool:
    digest = hashlib.sha256(f"{seed}:{task_id}".encode()).hexdigest()
    return int(digest[:8], 16) < held_out_fraction * 2**32


def split_tasks(
    task_ids: list[str], *, held_out_fraction: float = 0.5, seed: int = 0
) -> tuple[list[str], list[str]]:
    """(train, held_out), each sorted."""
    held = sorted(
        t for t in task_ids if is_held_out(t, held_out_fraction=held_out_fraction, seed=seed)
    )
    train = sorted(set(task_ids) - set(held))
    return train, held
