"""The event catalog: round trips, evolution rules, bad input."""

from __future__ import annotations

from enum import Enum

import msgspec
import pytest

from stacx import events as ev
from stacx import wire
from stacx.store.schema import TABLES


def _sample(cls: type[ev.Event]) -> ev.Event:
    values: dict[str, object] = {}
    hints = msgspec.structs.fields(cls)
    for f in hints:
        if f.default is not msgspec.NODEFAULT or f.default_factory is not msgspec.NODEFAULT:
            continue
        t = f.type
        if isinstance(t, type) and issubclass(t, Enum):
            values[f.name] = next(iter(t))
            continue
        values[f.name] = (
            "x"
            if t is str
            else 1
            if t is int
            else 0.5
            if t is float
            else [1, 2]
            if t == list[int]
            else [0.1]
            if t == list[float]
            else None
        )
    return cls(**values)  # type: ignore[arg-type]


@pytest.mark.parametrize("kind", sorted(ev.KINDS))
def test_every_kind_round_trips(kind: str) -> None:
    e = _sample(ev.KINDS[kind])
    back = wire.decode(wire.encode(e))
    assert back == e and type(back) is ev.KINDS[kind]
    assert back.kind == kind


def test_old_shaped_payload_still_decodes() -> None:
    # a TurnGenerated written before `engine`, `gen_ms`, `queue_ms`, `actor` existed
    old = {
        "kind": "TurnGenerated",
        "run_id": "r",
        "event_id": "e1",
        "ts": 1.0,
        "episode_id": "ep",
        "turn": 0,
        "prompt_ids": [1, 2],
        "output_ids": [3],
    }
    e = wire.decode(msgspec.msgpack.encode(old))
    assert isinstance(e, ev.TurnGenerated)
    assert e.actor == "student" and e.engine == "" and e.logprobs is None


def test_unknown_fields_from_a_newer_writer_are_ignored() -> None:
    newer = {
        "kind": "RewardAssigned",
        "run_id": "r",
        "episode_id": "ep",
        "reward": 1.0,
        "a_field_from_the_future": [1, 2, 3],
    }
    e = wire.decode(msgspec.msgpack.encode(newer))
    assert isinstance(e, ev.RewardAssigned) and e.reward == 1.0


def test_unknown_kind_and_wrong_types_are_errors() -> None:
    with pytest.raises(msgspec.ValidationError, match="Invalid value 'NoSuchKind'"):
        wire.decode(msgspec.msgpack.encode({"kind": "NoSuchKind", "run_id": "r"}))
    with pytest.raises(msgspec.ValidationError, match="reward"):
        wire.decode(
            msgspec.msgpack.encode(
                {"kind": "RewardAssigned", "run_id": "r", "episode_id": "e", "reward": "high"}
            )
        )


def test_new_fields_all_have_defaults_beyond_the_founding_set() -> None:
    # evolution rule 1, enforced: a kind's required fields are fixed once shipped
    required = {
        k: sorted(
            f.name
            for f in msgspec.structs.fields(c)
            if f.default is msgspec.NODEFAULT and f.default_factory is msgspec.NODEFAULT
        )
        for k, c in ev.KINDS.items()
    }
    assert required["TurnGenerated"] == ["episode_id", "output_ids", "prompt_ids", "run_id", "turn"]
    assert required["RewardAssigned"] == ["episode_id", "reward", "run_id"]


def test_derived_ids_are_deterministic_and_distinct() -> None:
    assert ev.derive_id("run", "g", 0) == ev.derive_id("run", "g", 0)
    assert ev.derive_id("run", "g", 0) != ev.derive_id("run", "g", 1)
    assert ev.new_id() != ev.new_id()


def test_events_are_frozen() -> None:
    e = ev.RunFinished(run_id="r", status=ev.RunStatus.COMPLETED)
    with pytest.raises(AttributeError):
        e.status = "failed"  # type: ignore[misc]


# Payloads as writers wrote them when these fields were plain strings (same wire values).
_OLD_ENUM_PAYLOADS: list[tuple[dict[str, object], str, Enum]] = [
    (
        {"kind": "EpisodeFinished", "run_id": "r", "episode_id": "e", "stop_reason": "max_turns"},
        "stop_reason",
        ev.StopReason.MAX_TURNS,
    ),
    (
        {"kind": "InfraFailed", "run_id": "r", "failure_kind": "verifier_timeout"},
        "failure_kind",
        ev.FailureKind.VERIFIER_TIMEOUT,
    ),
    (
        {
            "kind": "TurnGenerated",
            "run_id": "r",
            "episode_id": "e",
            "turn": 0,
            "prompt_ids": [1],
            "output_ids": [2],
            "actor": "teacher",
        },
        "actor",
        ev.TurnActor.TEACHER,
    ),
    (
        {
            "kind": "EpisodeStarted",
            "run_id": "r",
            "episode_id": "e",
            "task_id": "t",
            "group_id": "g",
            "policy": "branch",
        },
        "policy",
        ev.RollIn.BRANCH,
    ),
    (
        {"kind": "RunFinished", "run_id": "r", "status": "interrupted"},
        "status",
        ev.RunStatus.INTERRUPTED,
    ),
]


@pytest.mark.parametrize(("payload", "field", "member"), _OLD_ENUM_PAYLOADS)
def test_enum_fields_decode_old_string_payloads_to_members(
    payload: dict[str, object], field: str, member: Enum
) -> None:
    e = wire.decode(msgspec.msgpack.encode(payload))
    assert getattr(e, field) is member
    # and they are written back as the same strings, so old readers read new logs
    assert msgspec.msgpack.decode(wire.encode(e))[field] == payload[field]


def test_unknown_enum_value_fails_loudly() -> None:
    # rule 6: never coerced to a default or kept as a bare string; the recorder dead-letters it
    bad = {"kind": "EpisodeFinished", "run_id": "r", "episode_id": "e", "stop_reason": "gave_up"}
    with pytest.raises(msgspec.ValidationError, match="Invalid enum value 'gave_up'"):
        wire.decode(msgspec.msgpack.encode(bad))


def test_enum_fields_are_varchar_columns() -> None:
    # the columns these fields had as `str`: views and older trace files stay valid
    columns = {(t.kind, c.name): c.sql_type for t in TABLES.values() for c in t.columns}
    for kind, field in [
        ("EpisodeFinished", "stop_reason"),
        ("InfraFailed", "failure_kind"),
        ("TurnGenerated", "actor"),
        ("EpisodeStarted", "policy"),
        ("RunFinished", "status"),
    ]:
        assert columns[(kind, field)] == "VARCHAR"
