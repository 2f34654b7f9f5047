"""Token arrays on the wire as packed little-endian buffers (msgpack ext), decoded by the
recorder into Arrow LIST columns through numpy; old payloads (plain arrays) still decode."""

from __future__ import annotations

import msgspec
import numpy as np
import pyarrow as pa

from stacx import events as ev
from stacx import wire
from stacx.store.schema import to_arrow


def turn(**fields: object) -> ev.TurnGenerated:
    base: dict[str, object] = dict(
        run_id="r",
        episode_id="e",
        turn=0,
        prompt_ids=[1, 70_000, 3],
        output_ids=[4, 5],
        logprobs=[-0.5, -1e-300],
    )
    return ev.TurnGenerated(**{**base, **fields})  # type: ignore[arg-type]


def test_token_arrays_travel_packed_and_decode_as_lists() -> None:
    e = turn()
    raw = msgspec.msgpack.decode(wire.encode(e))
    ext = raw["prompt_ids"]
    assert isinstance(ext, msgspec.msgpack.Ext) and ext.code == wire.PACKED_INT
    assert np.frombuffer(ext.data, "<i4").tolist() == [1, 70_000, 3]
    assert raw["logprobs"].code == wire.PACKED_FLOAT  # float64: the DOUBLE[] column, exact
    assert wire.decode(wire.encode(e)) == e and wire.decode_many(wire.encode(e)) == [e]
    scripted = turn(logprobs=None, output_ids=[])
    assert wire.decode(wire.encode(scripted)) == scripted


def test_a_payload_with_plain_arrays_still_decodes() -> None:
    e = turn()
    old = msgspec.msgpack.encode(e)  # every log older than the packed form
    assert isinstance(msgspec.msgpack.decode(old)["prompt_ids"], list)
    assert wire.decode(old) == e
    both = wire.encode_batch([old, wire.encode(e)])
    assert wire.decode_many(both) == [e, e]


def test_the_recorders_columns_from_packed_bytes_equal_those_from_lists() -> None:
    events = [turn(), turn(turn=1, logprobs=None, output_ids=[]), turn(turn=2, prompt_ids=[])]
    packed = wire.decode_wire(wire.encode_batch([wire.encode(e) for e in events]))
    assert isinstance(packed[0].prompt_ids, msgspec.msgpack.Ext)  # type: ignore[attr-defined]
    old = wire.decode_wire(wire.encode_batch([msgspec.msgpack.encode(e) for e in events]))
    got, from_lists, expected = (
        to_arrow("TurnGenerated", evs, [1, 2, 3]) for evs in (packed, old, events)
    )
    assert got.equals(expected) and from_lists.equals(expected)
    assert got.column("prompt_ids").type == pa.list_(pa.int32())
    assert got.column("logprobs").to_pylist() == [[-0.5, -1e-300], None, [-0.5, -1e-300]]
