"""The teacher actor on a real run (NATS + DuckDB) with the real default model."""

from __future__ import annotations

from pathlib import Path

import pytest

from stacx.actors.run import RunContext
from stacx.agents.chat import ChatFormat
from stacx.agents.prompts import system_prompt, task_message
from stacx.events import EpisodeStarted, Event, TurnGenerated, prompt_split
from stacx.imitation.config import TeacherConfig
from stacx.imitation.teacher import TeacherActor, label_params
from stacx.inference.torch_engine import TorchEngine
from stacx.ports import SamplingParams
from stacx.train import units
from stacx.train.config import TrainerConfig
from tests.imitation.conftest import wait_for

pytestmark = pytest.mark.model
CONFIG = TeacherConfig(max_new_tokens=8, max_len=4096)


async def _student_turn(
    run_id: str, engine: TorchEngine, chat: ChatFormat, episode_id: str, turn: int, actor: str
) -> TurnGenerated:
    prompt = chat.start(system_prompt(), task_message(f"Write {turn} into /app/x.txt"))
    params = SamplingParams(max_new_tokens=8, temperature=1.0, seed=7 + turn)
    (gen,) = await engine.generate([prompt], params)
    return TurnGenerated(
        run_id=run_id,
        episode_id=episode_id,
        turn=turn,
        prompt_ids=prompt,
        output_ids=gen.output_ids,
        logprobs=gen.logprobs,
        weight_version=gen.weight_version,
        actor=actor,
    )


async def _teach(
    run: RunContext,
    engine: TorchEngine,
    chat: ChatFormat,
    events: list[Event],
    *,
    labeled: int,
    scored: int,
) -> None:
    """Emit `events`, run a labeling and scoring teacher until it has made that many of each."""
    for event in events:
        await run.emit(event)
    run.spawn(
        TeacherActor(engine, CONFIG, stop_token_ids=chat.stop_token_ids, label=True, score=True)
    )
    assert await wait_for(run.query, "SELECT count(*) FROM teacher_labeled", labeled) == labeled
    assert await wait_for(run.query, "SELECT count(*) FROM teacher_scored", scored) == scored
    await run.stop_actors()


async def test_labels_use_exact_prompt_ids_and_scores_equal_engine_score(
    tmp_path: Path, engine: TorchEngine, chat: ChatFormat
) -> None:
    async with RunContext(tmp_path / "run", recipe="test") as run:
        started = [
            EpisodeStarted(
                run_id=run.run_id,
                episode_id="e-mix",
                task_id="t",
                group_id="g",
                policy="mixture",
                iteration=1,
                beta=0.5,
            ),
            EpisodeStarted(
                run_id=run.run_id, episode_id="e-branch", task_id="t", group_id="g", policy="branch"
            ),
        ]
        turns = [
            await _student_turn(run.run_id, engine, chat, "e-mix", 0, "student"),
            await _student_turn(run.run_id, engine, chat, "e-mix", 1, "teacher"),
            await _student_turn(run.run_id, engine, chat, "e-branch", 0, "student"),
        ]
        await _teach(run, engine, chat, [*started, *turns], labeled=2, scored=1)
        labels = {
            r["turn"]: r
            for r in (
                await run.query("SELECT * FROM teacher_labeled WHERE episode_id = 'e-mix'")
            ).to_pylist()
        }
        scored = (await run.query("SELECT * FROM teacher_scored")).to_pylist()
        branch = await run.query(
            "SELECT (SELECT count(*) FROM teacher_labeled WHERE episode_id = 'e-branch') "
            "+ (SELECT count(*) FROM teacher_scored WHERE episode_id = 'e-branch')"
        )
        readiness = TrainerConfig(algorithm="dagger", label_actors=list(CONFIG.label_actors))
        sql = units.waiting_sql(readiness)
        pending = await run.query(sql, units.params(readiness, sql, 0))
        dataset = (
            await run.query(
                "SELECT turn, prompt_matches, iteration FROM dagger_dataset ORDER BY turn"
            )
        ).to_pylist()

    # DAgger: each visited state of the roll-in (student- and teacher-executed) is labeled on
    # the exact prompt ids, with the teacher's own action (greedy: reproducible here).
    assert sorted(labels) == [0, 1]
    for t, turn in enumerate(turns[:2]):
        assert labels[t]["prompt_ids"] == turn.prompt_ids
        params = label_params(CONFIG, len(turn.prompt_ids), chat.stop_token_ids, "e-mix", t)
        assert params is not None
        (expected,) = await engine.generate([turn.prompt_ids], params)
        assert labels[t]["label_ids"] == expected.output_ids
        assert labels[t]["iteration"] == 1
    assert dataset == [
        {"turn": 0, "prompt_matches": True, "iteration": 1},
        {"turn": 1, "prompt_matches": True, "iteration": 1},
    ]
    assert pending.column(0)[0].as_py() == 0
    # OPD: the student turn only; one teacher logprob per student output id, = Engine.score.
    (row,) = scored
    assert (row["episode_id"], row["turn"]) == ("e-mix", 0)
    student = turns[0]
    assert len(row["teacher_logprobs"]) == len(student.output_ids)
    assert row["teacher_logprobs"] == await engine.score(student.prompt_ids, student.output_ids)
    # AggreVaTe branch episodes are never labeled or scored.
    assert branch.column(0)[0].as_py() == 0


async def test_redelivered_turn_publishes_no_second_label(
    tmp_path: Path, engine: TorchEngine, chat: ChatFormat
) -> None:
    async with RunContext(tmp_path / "run", recipe="test") as run:
        await run.emit(
            EpisodeStarted(
                run_id=run.run_id, episode_id="e", task_id="t", group_id="g", policy="student"
            )
        )
        turn = await _student_turn(run.run_id, engine, chat, "e", 0, "student")
        run.spawn(TeacherActor(engine, CONFIG, stop_token_ids=chat.stop_token_ids, label=True))
        await run.emit(turn)
        assert await wait_for(run.query, "SELECT count(*) FROM teacher_labeled", 1) == 1
        # The same visited state delivered again (a new event id, e.g. a replayed log).
        import msgspec

        from stacx.events import new_id

        await run.emit(msgspec.structs.replace(turn, event_id=new_id()))
        await wait_for(run.query, "SELECT count(*) FROM teacher_labeled", 2, timeout=5)
        await run.stop_actors()
        n = await run.query("SELECT count(*) FROM teacher_labeled")
    assert n.column(0)[0].as_py() == 1


async def test_a_linearly_stored_turn_is_labeled_and_scored_on_its_whole_prompt(
    tmp_path: Path, engine: TorchEngine, chat: ChatFormat
) -> None:
    """Turn 1 extends turn 0's prompt + output, so its event holds only the new ids
    (prefix_len): the teacher labels and scores the whole prompt, read from the log."""
    async with RunContext(tmp_path / "run", recipe="test") as run:
        await run.emit(
            EpisodeStarted(
                run_id=run.run_id, episode_id="e", task_id="t", group_id="g", policy="student"
            )
        )
        first = await _student_turn(run.run_id, engine, chat, "e", 0, "student")
        head = first.prompt_ids + first.output_ids
        whole = head + chat.close(first.output_ids) + chat.observation("ok")
        (gen,) = await engine.generate([whole], SamplingParams(max_new_tokens=4, seed=3))
        prefix_len, new = prompt_split(whole, head)
        assert prefix_len > 0 and len(new) < len(whole)
        second = TurnGenerated(
            run_id=run.run_id,
            episode_id="e",
            turn=1,
            prompt_ids=new,
            prefix_len=prefix_len,
            output_ids=gen.output_ids,
            logprobs=gen.logprobs,
            weight_version=gen.weight_version,
        )
        await _teach(run, engine, chat, [first, second], labeled=2, scored=2)
        label = (await run.query("SELECT * FROM teacher_labeled WHERE turn = 1")).to_pylist()[0]
        score = (await run.query("SELECT * FROM teacher_scored WHERE turn = 1")).to_pylist()[0]
        matches = await run.query("SELECT prompt_matches FROM dagger_dataset WHERE turn = 1")
    assert label["prompt_ids"] == whole
    assert score["teacher_logprobs"] == await engine.score(whole, gen.output_ids)
    assert matches.column(0)[0].as_py() is True
