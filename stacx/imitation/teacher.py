"""The teacher actor: DAgger labels (``TeacherLabeled``) and OPD scores (``TeacherScored``) for the
turns of roll-in episodes, on each turn's whole prompt. Guarantees: ids and label seeds derive from
(episode, turn), so a redelivered turn publishes the same events; a label or score the teacher
cannot make is ``InfraFailed(engine)``. Limits: the teacher shares the student's tokenizer.
Design: docs/training.md#imitation-roll-ins-teacher-signals-branches
"""

from __future__ import annotations

import logging
from typing import Any, ClassVar

import msgspec

from stacx.actors.base import Actor
from stacx.errors import EngineError, StacxError
from stacx.events import (
    EpisodeStarted,
    Event,
    FailureKind,
    InfraFailed,
    RollIn,
    TeacherLabeled,
    TeacherScored,
    TurnActor,
    TurnGenerated,
    clipped,
    derive_id,
)
from stacx.imitation.config import TeacherConfig
from stacx.ports import Engine, SamplingParams

log = logging.getLogger(__name__)

ROLL_IN_POLICIES = (RollIn.STUDENT, RollIn.MIXTURE)


def label_params(
    config: TeacherConfig, n_prompt: int, stop_token_ids: list[int], episode_id: str, turn: int
) -> SamplingParams | None:
    """The teacher's sampling for one label, or None when the prompt leaves it no room."""
    room = config.max_len - n_prompt
    if room < 1:
        return None
    return SamplingParams(
        max_new_tokens=min(config.max_new_tokens, room),
        temperature=config.temperature,
        stop_token_ids=list(stop_token_ids),
        seed=int(derive_id(episode_id, turn, "label-seed")[:8], 16) & 0x7FFFFFFF,  # per state
    )


class TeacherActor(Actor):
    """One consumer shared by all teacher workers of a run."""

    name: ClassVar[str] = "teacher"
    kinds: ClassVar[tuple[type[Event], ...]] = (EpisodeStarted, TurnGenerated)
    shared: ClassVar[bool] = True
    max_inflight: ClassVar[int] = 8  # concurrent requests let the engine batch them
    ack_wait: ClassVar[float] = 300.0

    def __init__(
        self,
        engine: Engine,
        config: TeacherConfig,
        *,
        stop_token_ids: list[int],
        label: bool = False,
        score: bool = False,
    ) -> None:
        if not (label or score):
            raise ValueError("TeacherActor needs label=True (DAgger) or score=True (OPD)")
        self.engine = engine
        self.config = config
        self.stop_token_ids = list(stop_token_ids)
        self.label = label
        self.score = score
        self._episodes: dict[str, tuple[str, int]] = {}  # episode_id -> (policy, iteration)

    async def handle(self, event: Event) -> None:
        if isinstance(event, EpisodeStarted):
            self._episodes[event.episode_id] = (event.policy, event.iteration)
            return
        if not isinstance(event, TurnGenerated):
            return
        policy, iteration = await self._episode(event.episode_id)
        if policy not in ROLL_IN_POLICIES:
            return
        labels = self.label and event.actor in self.config.label_actors
        scores = self.score and event.actor == TurnActor.STUDENT and bool(event.output_ids)
        if not (labels or scores):
            return
        if event.prefix_len:  # stored linearly: the whole prompt comes from the log
            event = msgspec.structs.replace(
                event, prompt_ids=await self._prompt(event), prefix_len=0
            )
        if labels:
            await self._label(event, iteration)
        if scores:
            await self._score(event)

    async def _prompt(self, turn: TurnGenerated) -> list[int]:
        """The whole prompt of a turn stored as ``prefix_len`` + new ids (this query sees the
        delivered turn and every earlier one)."""
        table = await self.query(
            "SELECT prompt_ids FROM turns WHERE episode_id = ? AND turn = ?",
            [turn.episode_id, turn.turn],
        )
        if table.num_rows != 1:
            raise StacxError(
                f"turn {turn.turn} of {turn.episode_id} is not in the log ({table.num_rows} rows)"
            )
        return [int(i) for i in table.column("prompt_ids")[0].as_py()]

    async def _episode(self, episode_id: str) -> tuple[str, int]:
        known = self._episodes.get(episode_id)
        if known is not None:
            return known
        # A restarted actor resumes after the EpisodeStarted it already acknowledged: ask the log.
        table = await self.query(
            "SELECT policy, iteration FROM episode_started WHERE episode_id = ? LIMIT 1",
            [episode_id],
        )
        if table.num_rows == 0:
            return ("", 0)
        row = table.to_pylist()[0]
        known = (str(row["policy"]), int(row["iteration"]))
        self._episodes[episode_id] = known
        return known

    async def _label(self, turn: TurnGenerated, iteration: int) -> None:
        params = label_params(
            self.config, len(turn.prompt_ids), self.stop_token_ids, turn.episode_id, turn.turn
        )
        if params is None:
            await self._failed(
                turn,
                "label",
                f"prompt of {len(turn.prompt_ids)} tokens leaves "
                f"no room in the teacher's context ({self.config.max_len})",
            )
            return
        try:
            (gen,) = await self.engine.generate([list(turn.prompt_ids)], params)
        except EngineError as exc:
            await self._failed(turn, "label", str(exc))
            return
        await self.publish(
            TeacherLabeled(
                **self._fields(turn, "TeacherLabeled"),
                prompt_ids=list(turn.prompt_ids),
                label_ids=list(gen.output_ids),
                iteration=iteration,
                logprobs=None if gen.logprobs is None else list(gen.logprobs),
            )
        )

    async def _score(self, turn: TurnGenerated) -> None:
        try:
            logprobs = await self.engine.score(list(turn.prompt_ids), list(turn.output_ids))
        except EngineError as exc:
            await self._failed(turn, "score", str(exc))
            return
        if len(logprobs) != len(turn.output_ids):
            await self._failed(
                turn, "score", f"{len(logprobs)} logprobs for {len(turn.output_ids)} output ids"
            )
            return
        await self.publish(
            TeacherScored(
                **self._fields(turn, "TeacherScored"),
                teacher_logprobs=[float(x) for x in logprobs],
            )
        )

    def _fields(self, turn: TurnGenerated, kind: str) -> dict[str, Any]:
        """The fields of this teacher's label or score of `turn`."""
        name = self.config.name
        return dict(
            run_id=self.run_id,
            event_id=derive_id(turn.episode_id, turn.turn, kind, name),
            episode_id=turn.episode_id,
            turn=turn.turn,
            teacher=name,
        )

    async def _failed(self, turn: TurnGenerated, what: str, message: str) -> None:
        log.warning(
            "teacher %s of %s turn %d failed: %s", what, turn.episode_id, turn.turn, message
        )
        await self.publish(
            InfraFailed(
                run_id=self.run_id,
                event_id=derive_id(turn.episode_id, turn.turn, "InfraFailed", "teacher", what),
                failure_kind=FailureKind.ENGINE,
                message=clipped(f"teacher {what} of turn {turn.turn}: {message}"),
                # The visited state (episode_id, turn), so readiness knows this state's label
                # will never come; `turn` set: the episode itself is fine and is not marked
                # failed in the `episodes` view.
                episode_id=turn.episode_id,
                turn=turn.turn,
                will_retry=False,
            )
        )
