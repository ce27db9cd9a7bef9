"""msgspec typed structs of Kineto events (only the fields tracelens uses) and the decoders of a
chunk of `traceEvents` (integer / raw-text timestamps, lean args, loose fallbacks).

Part of tracelens.ingest.kineto (see its docstring).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Union

import msgspec

# --------------------------------------------------------------------------------------------- typed structs
_RAW_NONE = msgspec.Raw(b"")


class _Args(msgspec.Struct, frozen=True, gc=False):
    """The `args` keys of complete events tracelens uses; every other key is skipped by the decoder. Few
    fields, in Kineto's key order, make the decoder's key lookup cheaper (memory keys are in _MemArgs)."""

    # ids: int or str only (a float or bool sends the chunk to the loose decoder), so that numpy can read
    # them without truncating anything
    external_id: int | str | None = msgspec.field(name="External id", default=None)
    # autograd: a forward op and the backward node it recorded share this number (analyze.pipeline.composition)
    sequence_nr: int | str | None = msgspec.field(name="Sequence number", default=None)
    device: int | str | None = None
    stream: int | str | None = None
    correlation: int | str | None = None
    collective: int | float | str | bool | None = msgspec.field(name="Collective name", default=None)
    pg_name: int | float | str | bool | None = msgspec.field(name="Process Group Name", default=None)
    pg_desc: int | float | str | bool | None = msgspec.field(name="Process Group Description", default=None)
    pg_ranks: list[int] | int | float | str | bool | None = msgspec.field(
        name="Process Group Ranks", default=None
    )
    group_size: int | float | str | bool | None = msgspec.field(name="Group size", default=None)
    seq: int | float | str | bool | None = msgspec.field(name="Seq", default=None)
    in_nelems: int | float | str | bool | None = msgspec.field(name="In msg nelems", default=None)
    out_nelems: int | float | str | bool | None = msgspec.field(name="Out msg nelems", default=None)
    dtype: int | float | str | bool | None = None
    src_rank: int | float | str | bool | None = msgspec.field(name="Src Rank", default=None)
    dst_rank: int | float | str | bool | None = msgspec.field(name="Dst Rank", default=None)
    # shapes, kept as raw JSON text: decoded only for communication cpu ops (sizes of collectives whose
    # kernels carry no `In msg nelems`, PyTorch < ~2.3; comm_families.sizes_from_shapes)
    input_dims: msgspec.Raw = msgspec.field(name="Input Dims", default=_RAW_NONE)
    input_type: msgspec.Raw = msgspec.field(name="Input type", default=_RAW_NONE)


class _MemArgs(msgspec.Struct, frozen=True, gc=False):
    """The `args` keys of `[memory]` instant events: int or str only, as the ids of _Args (numpy reads them
    at once); any other value type sends the chunk to the loose decoder."""

    device_id: int | str | None = msgspec.field(name="Device Id", default=None)
    bytes: int | str | None = msgspec.field(name="Bytes", default=None)
    total_allocated: int | str | None = msgspec.field(name="Total Allocated", default=None)
    total_reserved: int | str | None = msgspec.field(name="Total Reserved", default=None)


class _LooseArgs(msgspec.Struct, frozen=True, gc=False):
    """Fallback for `args` whose values have unexpected JSON types (objects, nested lists)."""

    external_id: Any = msgspec.field(name="External id", default=None)
    sequence_nr: Any = msgspec.field(name="Sequence number", default=None)
    correlation: Any = None
    device: Any = None
    stream: Any = None
    collective: Any = msgspec.field(name="Collective name", default=None)
    pg_name: Any = msgspec.field(name="Process Group Name", default=None)
    pg_desc: Any = msgspec.field(name="Process Group Description", default=None)
    pg_ranks: Any = msgspec.field(name="Process Group Ranks", default=None)
    group_size: Any = msgspec.field(name="Group size", default=None)
    seq: Any = msgspec.field(name="Seq", default=None)
    in_nelems: Any = msgspec.field(name="In msg nelems", default=None)
    out_nelems: Any = msgspec.field(name="Out msg nelems", default=None)
    dtype: Any = None
    src_rank: Any = msgspec.field(name="Src Rank", default=None)
    dst_rank: Any = msgspec.field(name="Dst Rank", default=None)
    total_allocated: Any = msgspec.field(name="Total Allocated", default=None)
    total_reserved: Any = msgspec.field(name="Total Reserved", default=None)
    bytes: Any = msgspec.field(name="Bytes", default=None)
    device_id: Any = msgspec.field(name="Device Id", default=None)
    input_dims: Any = msgspec.field(name="Input Dims", default=None)
    input_type: Any = msgspec.field(name="Input type", default=None)


_EMPTY_ARGS = _Args()
_EMPTY_MEM_ARGS = _MemArgs()
_EMPTY_LOOSE_ARGS = _LooseArgs()


class _Event(msgspec.Struct, tag="X", tag_field="ph", gc=False):
    """A complete event (`ph: X`); `ts`/`dur` kept as raw JSON text for exact decimal conversion."""

    cat: str | None = None
    name: str | None = None
    pid: int | str | None = None  # no float: see _Args
    tid: int | str | None = None
    ts: msgspec.Raw = _RAW_NONE
    dur: msgspec.Raw = _RAW_NONE
    args: _Args = _EMPTY_ARGS


class _Instant(msgspec.Struct, tag="i", tag_field="ph", gc=False):
    """An instant event; only `[memory]` ones are kept."""

    name: str | None = None
    ts: msgspec.Raw = _RAW_NONE
    args: _MemArgs = _EMPTY_MEM_ARGS


class _InstantOld(_Instant, tag="I"):
    pass


class _EventInt(msgspec.Struct, tag="X", tag_field="ph", gc=False):
    """`_Event` for files whose timestamps are JSON integers (µs, as older Kineto writes them): decoding them
    as int is exact and cheaper than raw text. A float anywhere makes the chunk use `_Event`."""

    cat: str | None = None
    name: str | None = None
    pid: int | str | None = None
    tid: int | str | None = None
    ts: int | None = None
    dur: int | None = None
    args: _Args = _EMPTY_ARGS


class _InstantInt(msgspec.Struct, tag="i", tag_field="ph", gc=False):
    name: str | None = None
    ts: int | None = None
    args: _MemArgs = _EMPTY_MEM_ARGS


class _InstantOldInt(_InstantInt, tag="I"):
    pass


class _ArgsLean(msgspec.Struct, frozen=True, gc=False):
    """_Args without the collective keys other than `Collective name`: a third of the fields, which makes
    the decoder ~15% faster and freeing ~35% faster. Used for the chunks whose text does not name a
    collective (COLL_KEY; those are decoded with _Args at once), until a chunk decoded with it turns out to
    hold a collective or a communication cpu op (_columns raises _NeedFullArgs: that chunk is decoded again
    with _Args, and so is the rest of the file: _Hint.lean), so results are the same."""

    external_id: int | str | None = msgspec.field(name="External id", default=None)
    # autograd: a forward op and the backward node it recorded share this number (analyze.pipeline.composition)
    sequence_nr: int | str | None = msgspec.field(name="Sequence number", default=None)
    device: int | str | None = None
    stream: int | str | None = None
    correlation: int | str | None = None
    collective: int | float | str | bool | None = msgspec.field(name="Collective name", default=None)


_EMPTY_ARGS_LEAN = _ArgsLean()


class _EventLean(_Event, tag="X"):
    args: _ArgsLean = _EMPTY_ARGS_LEAN  # type: ignore[assignment]


class _EventIntLean(_EventInt, tag="X"):
    args: _ArgsLean = _EMPTY_ARGS_LEAN  # type: ignore[assignment]


#: Every other Chrome-trace phase decodes to an empty struct: the decoder skips its content. A phase not
#: listed here makes the chunk fall back to the loose decoder, which handles anything.
_OTHER_PHASES = tuple(
    msgspec.defstruct(f"_Phase{ord(t)}", [], tag=t, tag_field="ph", gc=False)
    for t in "BEbnestfPONDMRCcSTFpVv()"
)
# Unions built at run time from tuples of struct types: `Any` to mypy, which cannot follow them (and reads
# `Union[(a, *b)]` as 3.11-only star syntax); msgspec gets the same typing.Union as before.
_TAGGED: Any = Union[(_Event, _Instant, _InstantOld) + _OTHER_PHASES]  # noqa: UP007 (a runtime tuple of types)
_TAGGED_INT: Any = Union[(_EventInt, _InstantInt, _InstantOldInt) + _OTHER_PHASES]  # noqa: UP007
_TAGGED_LEAN: Any = Union[(_EventLean, _Instant, _InstantOld) + _OTHER_PHASES]  # noqa: UP007
_TAGGED_INT_LEAN: Any = Union[(_EventIntLean, _InstantInt, _InstantOldInt) + _OTHER_PHASES]  # noqa: UP007


class _LooseEvent(msgspec.Struct, gc=False):
    ph: Any = None
    cat: Any = None
    name: Any = None
    pid: Any = None
    tid: Any = None
    ts: msgspec.Raw = _RAW_NONE
    dur: msgspec.Raw = _RAW_NONE
    args: _LooseArgs | None = _EMPTY_LOOSE_ARGS


class _Top(msgspec.Struct):
    """Top-level keys of a Kineto file (metadata); `traceEvents` is None when the key is absent."""

    traceEvents: list[_TAGGED] | None = None
    schemaVersion: Any = None
    deviceProperties: Any = None
    distributedInfo: Any = None
    host_name: Any = None
    trace_id: Any = None
    baseTimeNanoseconds: Any = None


class _TopLoose(_Top):
    """The same keys, events decoded by the loose decoder."""

    traceEvents: list[_LooseEvent] | None = None


_DEC_EVENTS = msgspec.json.Decoder(list[_TAGGED])
_DEC_EVENTS_INT = msgspec.json.Decoder(list[_TAGGED_INT])
_DEC_EVENTS_LEAN = msgspec.json.Decoder(list[_TAGGED_LEAN])
_DEC_EVENTS_INT_LEAN = msgspec.json.Decoder(list[_TAGGED_INT_LEAN])
_DEC_EVENTS_LOOSE = msgspec.json.Decoder(list[_LooseEvent])
_DEC_TOP = msgspec.json.Decoder(_Top)
_DEC_TOP_LOOSE = msgspec.json.Decoder(_TopLoose)
_DEC_EVENT_LOOSE = msgspec.json.Decoder(_LooseEvent)
_DEC_EVENTS_RAW = msgspec.json.Decoder(list[msgspec.Raw])


class _TopRaw(_TopLoose):
    traceEvents: list[msgspec.Raw] | None = None  # type: ignore[assignment]


_DEC_TOP_RAW = msgspec.json.Decoder(_TopRaw)
_DEC_ANY = msgspec.json.Decoder()

_META_KEYS = (
    "schemaVersion",
    "deviceProperties",
    "distributedInfo",
    "host_name",
    "trace_id",
    "baseTimeNanoseconds",
)


@dataclass
class _Hint:
    """Carried from chunk to chunk: whether integer timestamps are still worth trying, and whether the lean
    args struct still is (no lean-decoded chunk has needed the full one yet)."""

    int_ts: bool = True
    lean: bool = True


#: The key of a collective's args: a chunk whose text holds it is decoded with the full args struct at once
#: (with _ArgsLean its _columns would raise _NeedFullArgs, after most of the work, and decode it again).
COLL_KEY = b'"Collective name"'
#: A point-to-point kernel may carry its peers without a collective name (older PyTorch, stripped args):
#: a chunk holding this key is decoded with the full args too, and its rows with a peer are collective rows.
PEER_KEY = b'"Src Rank"'


def _decode_events(piece: bytes | memoryview, hint: _Hint | None = None, lean_ok: bool = True) -> list:
    """Typed decode of a JSON array of events: integer-timestamp structs first (unless a previous chunk had
    fractional timestamps), then raw-text timestamps, then the loose structs for odd value types. The lean
    args struct is used while `hint.lean` and `lean_ok` (the caller's finding that the chunk names no
    collective: COLL_KEY)."""
    lean = hint is not None and hint.lean and lean_ok
    if hint is None or hint.int_ts:
        try:
            return (_DEC_EVENTS_INT_LEAN if lean else _DEC_EVENTS_INT).decode(piece)
        except msgspec.ValidationError:
            pass
    try:
        evs = (_DEC_EVENTS_LEAN if lean else _DEC_EVENTS).decode(piece)
    except msgspec.ValidationError:
        try:
            return _DEC_EVENTS_LOOSE.decode(piece)
        except msgspec.ValidationError:
            return _loose_each(_DEC_EVENTS_RAW.decode(piece))
    if hint is not None:
        hint.int_ts = False  # the typed decode failed only on ts/dur: this file writes fractional µs
    return evs


def _loose_each(raws: list) -> list:
    """Events decoded one by one (loose), skipping array elements that are not event objects (a number, a
    string, an object whose `args` is not an object): the last fallback for damaged files."""
    out = []
    for r in raws:
        try:
            out.append(_DEC_EVENT_LOOSE.decode(r))
        except msgspec.ValidationError:
            continue
    return out


def _decode_top(doc: bytes) -> Any:
    try:
        return _DEC_TOP.decode(doc)
    except msgspec.ValidationError:
        pass
    try:
        return _DEC_TOP_LOOSE.decode(doc)
    except msgspec.ValidationError:
        # still failing when traceEvents is not an array at all (the caller reports it)
        top = _DEC_TOP_RAW.decode(doc)
    if top.traceEvents is not None:
        top.traceEvents = _loose_each(top.traceEvents)
    return top
