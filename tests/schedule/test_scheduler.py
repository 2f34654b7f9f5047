"""The scheduler's pure core: which tasks, which iterations are due, when the run is done."""

from __future__ import annotations

from collections import Counter

from stacx.schedule.scheduler import (
    LogState,
    Plan,
    TaskRef,
    iteration_events,
    iterations_due,
    tasks_for_iteration,
    verdict,
)

TASKS = [TaskRef(f"t{i}", f"/tasks/t{i}") for i in range(5)]


def _plan(**kw: object) -> Plan:
    base: dict[str, object] = {"tasks": TASKS, "per_iteration": 2, "group_size": 3, "steps": 4}
    base.update(kw)
    return Plan(**base)  # type: ignore[arg-type]


def _state(
    version: int = 0,
    done: int = 0,
    lost: int = 0,
    iterations: int = 0,
    scheduled: int = 0,
    ready: int | None = None,
) -> LogState:
    return LogState(
        scheduled=frozenset(),
        iterations=iterations,
        version=version,
        samples_done=done,
        samples_scheduled=scheduled,
        groups_lost=lost,
        ready_units=ready,
    )


def test_tasks_are_deterministic_and_cover_each_epoch() -> None:
    a = [tasks_for_iteration(TASKS, 2, 7, k) for k in range(10)]
    b = [tasks_for_iteration(list(reversed(TASKS)), 2, 7, k) for k in range(10)]
    assert a == b  # a pure function of the task set, seed and iteration (not of list order)
    drawn = [t.task_id for it in a for t in it]
    assert Counter(drawn[:5]) == Counter(t.task_id for t in TASKS)  # first epoch: each once
    assert Counter(drawn) == Counter({t.task_id: 4 for t in TASKS})
    assert (
        tasks_for_iteration(TASKS, 2, 8, 0) != a[0] or tasks_for_iteration(TASKS, 2, 8, 1) != a[1]
    )


def test_sync_schedules_one_iteration_per_version() -> None:
    p = _plan(mode="sync")
    assert iterations_due(p, _state(0)) == [0]
    assert iterations_due(p, _state(2)) == [0, 1, 2]
    assert iterations_due(p, _state(9)) == [0, 1, 2, 3]  # never past trainer.steps - 1


def test_async_runs_ahead_by_max_staleness() -> None:
    p = _plan(mode="async", max_staleness=2)
    assert iterations_due(p, _state(0)) == [0, 1, 2]
    assert iterations_due(p, _state(1)) == [0, 1, 2, 3]


def test_starved_trainer_gets_a_refill_until_the_cap() -> None:
    from stacx.train.config import TrainerConfig

    p = _plan(mode="sync", steps=2, trainer=TrainerConfig(algorithm="sft", batch_episodes=6))
    # iteration 0 settled (6 samples done) but only 2 episodes passed the filter: refill
    s = _state(version=0, iterations=1, done=6, scheduled=6, ready=2)
    assert iterations_due(p, s) == [0, 1]
    # still in flight: wait, do not refill
    assert iterations_due(p, _state(version=0, iterations=2, done=8, scheduled=12, ready=4)) == [0]
    # enough ready units: the trainer will step; no refill
    assert iterations_due(p, _state(version=0, iterations=1, done=6, scheduled=6, ready=6)) == [0]
    # the last version is out (its periodic eval still running): the trainer is done, no refill
    done = _state(version=2, iterations=2, done=12, scheduled=12, ready=0)
    assert iterations_due(p, done) == [0, 1]
    # at the cap (4 x steps) and still starved: the run ends, saying why
    capped = _state(version=1, iterations=8, done=48, scheduled=48, ready=0)
    assert iterations_due(p, capped) == [0, 1]
    assert verdict(p, capped) is not None
    assert (verdict(p, capped) or "").startswith("starved")


def test_training_done_at_final_version() -> None:
    p = _plan(steps=3)
    assert verdict(p, _state(version=2)) is None
    assert verdict(p, _state(version=3)) == "completed"


def test_eval_done_when_every_sample_settles() -> None:
    p = _plan(eval=True)
    total = len(TASKS) * 3
    assert iterations_due(p, _state()) == [0]
    assert verdict(p, _state(done=total - 1)) is None
    assert verdict(p, _state(done=total)) == "completed"
    # an unreadable task's group counts as settled
    assert verdict(p, _state(done=total - 3, lost=1)) == "completed"


def test_event_ids_and_groups_are_derived() -> None:
    p = _plan()
    first = iteration_events("run-a", p, 1)
    again = iteration_events("run-a", p, 1)
    assert [e.event_id for e in first] == [e.event_id for e in again]
    assert [e.group_id for e in first] == [e.group_id for e in again]
    assert len({e.group_id for e in first}) == p.per_iteration
    assert {e.event_id for e in first}.isdisjoint(
        e.event_id for e in iteration_events("run-b", p, 1)
    )
    assert all(e.n_samples == 3 and e.iteration == 1 and e.split == "train" for e in first)
    evals = iteration_events("run-a", _plan(eval=True), 0)
    assert sorted(e.task_id for e in evals) == sorted(t.task_id for t in TASKS)
    assert all(e.split == "eval" for e in evals)


def test_sync_iterations_name_the_weights_they_must_be_generated_with() -> None:
    from stacx.train.config import TrainerConfig

    sync = _plan(trainer=TrainerConfig(algorithm="dagger", steps=4, steps_per_iteration=2))
    assert sync.iterations == 2
    assert {e.weight_version for e in iteration_events("r", sync, 1, version=2)} == {2}
    # a refill beyond the last due iteration is generated by the newest weights
    assert {e.weight_version for e in iteration_events("r", sync, 3, version=2)} == {2}
    asynchronous = _plan(mode="async")
    assert {e.weight_version for e in iteration_events("r", asynchronous, 1, version=0)} == {None}
    assert {e.weight_version for e in iteration_events("r", _plan(eval=True), 0, 0)} == {None}
    # iteration 1 is due only once version 2 (= 1 x steps_per_iteration) is published
    assert iterations_due(sync, _state(version=1)) == [0]
    assert iterations_due(sync, _state(version=2)) == [0, 1]
