"""The wire form of the event catalog: msgpack, one event or a batch of one kind per message, token
arrays packed. Guarantees: `decode(encode(e)) == e`; every older log's payloads still decode; a
malformed payload raises msgspec's DecodeError/ValidationError, never a half-read event; a reader
older than the packed form fails loudly, never misreads.
Design: docs/concepts/events.md#token-arrays-on-the-wire
"""

from __future__ import annotations

import types
import typing
from typing import Final

import msgspec
import numpy as np

from stacx.events import KINDS, AnyEvent, Event

# Every list[int] / list[float] field of an event travels as a msgpack ext of its little-endian
# int32 (ext 1: INTEGER[]) or float64 (ext 2: DOUBLE[]) bytes.
PACKED_INT, PACKED_FLOAT = 1, 2
_DTYPES: Final = {PACKED_INT: "<i4", PACKED_FLOAT: "<f8"}


def _packed_fields(cls: type[Event]) -> dict[str, int]:
    out = {}
    for name, hint in typing.get_type_hints(cls).items():
        union = typing.get_origin(hint) in (typing.Union, types.UnionType)
        args = [a for a in typing.get_args(hint) if a is not type(None)] if union else [hint]
        item = typing.get_args(args[0])[0] if typing.get_origin(args[0]) is list else None
        if len(args) == 1 and item in (int, float):
            out[name] = PACKED_INT if item is int else PACKED_FLOAT
    return out


def _wire_struct(cls: type[Event], packed: dict[str, int]) -> type[Event]:
    """A subclass of `cls` (same tag) whose packed fields also take a msgpack Ext."""
    n, hints = len(cls.__struct_defaults__), typing.get_type_hints(cls)
    names = cls.__struct_fields__[len(cls.__struct_fields__) - n :]
    defaults = dict(zip(names, cls.__struct_defaults__, strict=True))
    fields = [
        (f, hints[f] | msgspec.msgpack.Ext, defaults.get(f, msgspec.NODEFAULT)) for f in packed
    ]
    wire = msgspec.defstruct(
        cls.__name__, fields, bases=(cls,), frozen=True, kw_only=True, tag=True
    )
    return typing.cast(type[Event], wire)


PACKED: Final = {k: f for k, f in ((k, _packed_fields(c)) for k, c in KINDS.items()) if f}
"""Per kind with token arrays: its packed fields and their ext codes."""
_WIRE: Final = {k: _wire_struct(KINDS[k], f) for k, f in PACKED.items()}
_WIRE_EVENT: object = typing.Union[tuple(_WIRE.get(k, c) for k, c in KINDS.items())]  # noqa: UP007
_encoder = msgspec.msgpack.Encoder()
_decoder: msgspec.msgpack.Decoder[Event] = msgspec.msgpack.Decoder(_WIRE_EVENT)  # type: ignore[arg-type]


def packed_array(value: object, code: int) -> np.ndarray:
    """A packed field's value as a numpy array: a view of an Ext's bytes, or a list copied."""
    if isinstance(value, msgspec.msgpack.Ext):
        return np.frombuffer(typing.cast(bytes, value.data), _DTYPES[value.code])
    return np.asarray(value, dtype=_DTYPES[code])


def encode(event: Event) -> bytes:
    """Wire form (msgpack) of an event, its token arrays packed."""
    packed = PACKED.get(type(event).__name__)
    if packed:
        fields = msgspec.structs.asdict(event)
        for f, c in packed.items():
            if fields[f] is not None:
                fields[f] = msgspec.msgpack.Ext(c, packed_array(fields[f], c).tobytes())
        event = _WIRE[type(event).__name__](**fields)
    return _encoder.encode(event)


def _unwire(event: Event) -> AnyEvent:
    """The catalog's own event of a decoded wire event: packed arrays as lists."""
    kind = type(event).__name__
    if kind not in PACKED:
        return event  # type: ignore[return-value]
    fields = msgspec.structs.asdict(event)
    for f, c in PACKED[kind].items():
        if isinstance(fields[f], msgspec.msgpack.Ext):
            fields[f] = packed_array(fields[f], c).tolist()
    return KINDS[kind](**fields)  # type: ignore[return-value]


def decode(payload: bytes) -> AnyEvent:
    """Decode a wire payload; raises msgspec.DecodeError/ValidationError on bad input."""
    return _unwire(_decoder.decode(payload))


def decode_wire(payload: bytes) -> list[Event]:
    """A message's events as on the wire, packed arrays kept as msgpack Ext (for the recorder)."""
    return _batch_decoder.decode(payload) if is_batch(payload) else [_decoder.decode(payload)]


_batch_decoder: msgspec.msgpack.Decoder[list[Event]] = msgspec.msgpack.Decoder(list[_WIRE_EVENT])  # type: ignore[valid-type]
_raw_list_decoder: msgspec.msgpack.Decoder[list[msgspec.Raw]] = msgspec.msgpack.Decoder(
    list[msgspec.Raw]
)


def encode_batch(payloads: list[bytes]) -> bytes:
    """Wire form of several events of one kind in one message (one event is sent as its map)."""
    n = len(payloads)
    head = (
        bytes([0x90 | n])
        if n < 16
        else (b"\xdc" + n.to_bytes(2, "big") if n < 1 << 16 else b"\xdd" + n.to_bytes(4, "big"))
    )
    return head + b"".join(payloads)


def is_batch(payload: bytes) -> bool:
    """A msgpack array (fixarray, array16, array32) rather than a single event's map."""
    return bool(payload) and (0x90 <= payload[0] <= 0x9F or payload[0] in (0xDC, 0xDD))


def decode_many(payload: bytes) -> list[AnyEvent]:
    """The events of one message, single or batch; raises like ``decode`` on bad input."""
    return [_unwire(e) for e in decode_wire(payload)]


def split_batch(payload: bytes) -> list[bytes]:
    """A batch's events as separate wire payloads (to tell good events from bad ones)."""
    return [bytes(r) for r in _raw_list_decoder.decode(payload)] if is_batch(payload) else [payload]
