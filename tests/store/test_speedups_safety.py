"""Adversarial input for the C extension (ferrymq.store._speedups): malformed batch bodies and commit log
bytes, arguments at and past the buffer ends, out-of-range offsets, odd clocks, wrong types. Every call
returns or raises a Python exception, and nothing is written out of place. The regression tests of the
safety review; the long-running fuzzer (run under AddressSanitizer) is benchmarks/fuzz_speedups.py."""

from __future__ import annotations

import mmap
import struct
from collections.abc import Callable
from typing import Any

import pytest
from dispatch_streams import BORN_HOST, STORE_HOST, RecordSpec, encode_spec, require_extension
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ferrymq.common.message_codec import encode_batch_body
from ferrymq.store import speedups

INT64_MAX = (1 << 63) - 1
TS = 1_700_000_000_000
BODY = encode_batch_body([(0, b"abc", "TAGS\x01a\x02KEYS\x01k1 k2"), (1, b"", "UNIQ_KEY\x01u")])
ENTRY = speedups.SCAN_INDEX_ENTRY
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def put(native: Any, mm: Any, body: Any = BODY, pos: int = 0, room: int | None = None, queue_offset: int = 0,
        phy_offset: int = 0, sys_flag: int = 0, clock: Any = lambda: TS, max_body: int = 1 << 22) -> Any:
    return native.put_batch(mm, pos, len(mm) - pos if room is None else room, body, b"TopicA", 0, queue_offset,
                            phy_offset, b"", b"DefaultCluster", BORN_HOST, STORE_HOST, TS, clock, sys_flag, 0,
                            32767, max_body)


def stream(n: int = 3) -> bytes:
    out = b""
    for i in range(n):
        out += encode_spec(RecordSpec("TopicA", i % 2, i // 2, 0, f"KEYS\x01k{i}\x02TAGS\x01t", b"x" * i, TS + i),
                           len(out))
    return out


# ---- put_batch ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("queue_offset", "phy_offset"), [
    (INT64_MAX, 0), (INT64_MAX - 1, 0), (0, INT64_MAX), (0, INT64_MAX - 100), (-1, 0), (0, -1),
])
def test_put_batch_offsets_that_would_overflow_int64_are_left_to_python(queue_offset: int, phy_offset: int) -> None:
    native = require_extension()
    mm = bytearray(4096)
    assert put(native, mm, queue_offset=queue_offset, phy_offset=phy_offset) is None
    assert mm == bytearray(4096)
    # the largest offsets that still fit are written
    count, total, offsets, _ids, _ts = put(native, mm, queue_offset=INT64_MAX - 2)
    assert count == 2 and offsets[0] == 0 and 0 < offsets[1] < total
    res = put(native, bytearray(4096), phy_offset=INT64_MAX - total)
    assert res is not None and res[2][-1] < INT64_MAX


@pytest.mark.parametrize("sys_flag", [0x10, 0x20, 0x30, -1])
def test_put_batch_ipv6_host_flags_are_left_to_python(sys_flag: int) -> None:
    native = require_extension()
    assert put(native, bytearray(4096), sys_flag=sys_flag) is None


def _assert_short_or_closed_mm_refused(native: Any, putter: Callable[..., Any]) -> None:
    """A closed mmap, a read-only buffer and a segment shorter than ``room`` / ``pos`` say: refused, nothing
    written (put_batch and put_one alike)."""
    m = mmap.mmap(-1, 4096)
    m.close()
    with pytest.raises(ValueError):
        putter(native, m, room=4096)
    with pytest.raises((TypeError, BufferError)):
        putter(native, bytes(4096))
    short = bytearray(100)
    with pytest.raises(ValueError):  # room says it fits, mm does not
        putter(native, short, room=4096)
    with pytest.raises(ValueError):
        putter(native, short, pos=101, room=4096)
    assert short == bytearray(100)


def test_put_batch_closed_or_read_only_or_short_mm() -> None:
    native = require_extension()
    _assert_short_or_closed_mm_refused(native, put)
    with pytest.raises(ValueError):
        put(native, bytearray(10), pos=-1)


def test_put_batch_body_inside_mm() -> None:
    """The batch body a view of the segment it is written to: defined (if useless) bytes, no crash."""
    native = require_extension()
    mm = bytearray(4096)
    mm[: len(BODY)] = BODY
    view = memoryview(mm)[: len(BODY)]
    with pytest.raises(BufferError):
        mm.extend(b"x")  # the view pins mm, as the call's buffer exports do
    res = put(native, mm, body=view)
    view.release()
    assert res is not None and res[0] == 2


def _mutations() -> st.SearchStrategy[bytes]:
    edges = st.sampled_from([-(1 << 31), -1, 0, 1, 19, 20, 21, 22, 0x7FFF, 0x8000, 0xFFFF, (1 << 31) - 1])

    def apply(args: tuple[int, int, int, int, bytes]) -> bytes:
        kind, at, width, value, extra = args
        buf = bytearray(BODY)
        at %= len(buf) + 1
        if kind == 0:
            del buf[at:]
        elif kind == 1 and at + width <= len(buf):
            buf[at:at + width] = (value & ((1 << 8 * width) - 1)).to_bytes(width, "big")
        else:
            buf[at:at] = extra
        return bytes(buf)

    return st.tuples(st.integers(0, 2), st.integers(0, 200), st.sampled_from([2, 4]), edges,
                     st.binary(max_size=30)).map(apply)


@SETTINGS
@given(body=st.one_of(_mutations(), st.binary(max_size=200)), room=st.integers(-1, 5000),
       pos=st.integers(0, 5000))
def test_put_batch_malformed_bodies_stay_in_bounds(body: bytes, room: int, pos: int) -> None:
    native = require_extension()
    guard = b"\xee" * 64
    mm = bytearray(2048) + guard
    try:
        res = native.put_batch(memoryview(mm)[:2048], pos, room, body, b"TopicA", 0, 0, 0, b"", b"C", BORN_HOST,
                               STORE_HOST, TS, lambda: TS, 0, 0, 32767, 1 << 22)
    except ValueError:
        res = None  # pos past mm, or records larger than mm at pos
    assert mm[2048:] == guard
    if res is not None and res[2] is not None:
        count, total, offsets, ids, _ts = res
        assert 0 < total <= min(room, 2048 - pos) and len(offsets) == count == len(ids.split(","))


# the buffer arguments of put_batch (body, topic, merge_props, cluster, born_host, store_host) as bytes; longer
# than 16 bytes (but the hosts) so a ctypes copy's memory is malloc'd and a ctypes.resize frees it
_BATCH_BUFFERS = {
    3: encode_batch_body([(0, b"B" * 40, "TAGS\x01a\x02KEYS\x01k1 k2"), (1, b"b" * 24, "UNIQ_KEY\x01u")]),
    4: b"T" * 40, 8: b"KEYS\x01" + b"m" * 40, 9: b"C" * 40, 10: BORN_HOST, 11: STORE_HOST,
}


def _batch_args(mm: Any, **over: Any) -> list[Any]:
    args: list[Any] = [mm, 0, len(mm), _BATCH_BUFFERS[3], _BATCH_BUFFERS[4], 3, 7, 4096, _BATCH_BUFFERS[8],
                       _BATCH_BUFFERS[9], _BATCH_BUFFERS[10], _BATCH_BUFFERS[11], TS, lambda: TS, 0, 0, 32767,
                       1 << 22]
    for at, value in over.items():
        args[int(at[1:])] = value
    return args


def _ctypes_copy(data: bytes) -> Any:
    """A ctypes array holding data in malloc'd memory (a buffer with no bf_releasebuffer: "y#" and a Py_buffer
    hand out borrowed pointers into it, and ctypes.resize reallocates it). Arrays of at most 16 bytes live
    inside the object; growing one past that and shrinking it back keeps its memory on the heap."""
    import ctypes  # noqa: PLC0415

    if not data:
        return (ctypes.c_char * 0)()
    arr = (ctypes.c_char * 1)()
    ctypes.resize(arr, max(len(data), 17))
    if len(data) <= 16:
        ctypes.resize(arr, len(data))  # b_size shrinks, the memory stays malloc'd
    ctypes.memmove(arr, data, len(data))
    assert bytes(memoryview(arr)) == data
    return arr


def _move_and_reuse(arrays: list[Any], keep: list[Any]) -> None:
    """ctypes.resize every array (its old memory is freed) and fill fresh allocations of the old sizes with
    0x55, so that a pointer into the freed memory reads junk (and ASan reports a heap-use-after-free)."""
    import ctypes  # noqa: PLC0415

    for a in arrays:
        size = ctypes.sizeof(a)
        ctypes.resize(a, 1 << 16)
        ctypes.memset(a, 0x55, 1 << 16)
        for _ in range(8):
            junk = _ctypes_copy(b"\x55" * size)
            keep.append(junk)


_PINNED_SETS = [(3,), (4,), (8,), (9,), (10,), (11,), (3, 4, 8, 9, 10, 11)]


@pytest.mark.parametrize("ats", _PINNED_SETS)
def test_put_batch_ctypes_arguments_moved_by_the_clock_are_not_read_after_free(ats: tuple[int, ...]) -> None:
    """Regression (use after free, as put_one's): "y#" and the batch body's Py_buffer hand out pointers into a
    ctypes array without locking it; a clock that ctypes.resize()s it freed that memory before the records
    were written (the body, topic and hosts are read after the clock). put_batch now copies such arguments to
    bytes first; the records are those of plain bytes."""
    native = require_extension()
    expected_mm = bytearray(4096)
    expected = native.put_batch(*_batch_args(expected_mm))
    assert expected is not None and expected[2] is not None
    arrays = [_ctypes_copy(_BATCH_BUFFERS[at]) for at in ats]
    keep: list[Any] = []

    def clock() -> int:
        _move_and_reuse(arrays, keep)
        return TS

    mm = bytearray(4096)
    over = {f"a{at}": a for at, a in zip(ats, arrays, strict=True)}
    assert native.put_batch(*_batch_args(mm, a13=clock, **over)) == expected
    assert mm == expected_mm
    assert keep  # the clock ran


@pytest.mark.parametrize("ats", _PINNED_SETS)
@pytest.mark.parametrize("index_at", [5, 12, 14, 15, 17])
def test_put_batch_ctypes_arguments_moved_by_an_index_are_not_read_after_free(ats: tuple[int, ...],
                                                                              index_at: int) -> None:
    """The same with an __index__ run while PyArg_ParseTuple parses the arguments after the "y#" ones (the
    queue id after the topic; born_timestamp, sys_flag, reconsume_times, max_body after them all)."""
    native = require_extension()
    expected_mm = bytearray(4096)
    expected = native.put_batch(*_batch_args(expected_mm))
    arrays = [_ctypes_copy(_BATCH_BUFFERS[at]) for at in ats]
    keep: list[Any] = []
    plain = _batch_args(bytearray(0))[index_at]

    class Moving:
        def __index__(self) -> int:
            _move_and_reuse(arrays, keep)
            return int(plain)

    mm = bytearray(4096)
    over = {f"a{at}": a for at, a in zip(ats, arrays, strict=True)}
    assert native.put_batch(*_batch_args(mm, **{f"a{index_at}": Moving()}, **over)) == expected
    assert mm == expected_mm
    assert keep


def test_put_batch_ctypes_and_odd_buffer_arguments_answer_as_bytes_do() -> None:
    """Pinned copies change nothing else: ctypes arguments of every position write what bytes write (and are
    left as they were), too-short hosts / bad topics raise the same ValueError, a ctypes array where an int or
    the clock goes raises the same TypeError, and "y#" still refuses locking exporters (bytearray)."""
    import ctypes  # noqa: PLC0415

    native = require_extension()
    expected_mm = bytearray(4096)
    expected = native.put_batch(*_batch_args(expected_mm))
    arrays = {f"a{at}": _ctypes_copy(data) for at, data in _BATCH_BUFFERS.items()}
    mm = bytearray(4096)
    assert native.put_batch(*_batch_args(mm, **arrays)) == expected
    assert mm == expected_mm
    assert all(bytes(memoryview(arrays[f"a{at}"])) == data for at, data in _BATCH_BUFFERS.items())
    small = (ctypes.c_char * 8).from_buffer_copy(STORE_HOST)  # in-object memory: same answer
    assert native.put_batch(*_batch_args(bytearray(4096), a11=small)) == expected
    for over in ({"a10": _ctypes_copy(BORN_HOST[:7])}, {"a4": _ctypes_copy(b"")}, {"a4": _ctypes_copy(b"t" * 128)}):
        with pytest.raises(ValueError, match="bad topic, host"):
            native.put_batch(*_batch_args(bytearray(4096), **over))
    for at in (1, 5, 13):
        with pytest.raises(TypeError):
            native.put_batch(*_batch_args(bytearray(4096), **{f"a{at}": _ctypes_copy(b"x" * 20)}))
    for at in (4, 8, 9, 10, 11):
        with pytest.raises(TypeError):
            native.put_batch(*_batch_args(bytearray(4096), **{f"a{at}": bytearray(_BATCH_BUFFERS[at])}))
    with pytest.raises(TypeError):  # the count is checked as before
        native.put_batch(*_batch_args(bytearray(4096), **arrays)[:12])
    assert native.put_batch(*_batch_args(bytearray(4096), a8=_ctypes_copy("é\x01x".encode()))) is None


# ---- put_one ----------------------------------------------------------------------------------------------

ONE_PROPS = b"TAGS\x01a\x02KEYS\x01k1 k2\x02WAIT\x01false"


def put1(native: Any, mm: Any, body: Any = b"abc", props: Any = ONE_PROPS, pos: int = 0, room: int | None = None,
         queue_offset: int = 0, phy_offset: int = 0, flag: int = 0, sys_flag: int = 0, reconsume: int = 0,
         clock: Any = lambda: TS, max_props: int = 32767, max_body: int = 1 << 22, topic: bytes = b"TopicA",
         queue_id: int = 0, born_ts: int = TS) -> Any:
    return native.put_one(mm, pos, len(mm) - pos if room is None else room, body, props, topic, queue_id,
                          queue_offset, phy_offset, b"DefaultCluster", BORN_HOST, STORE_HOST, born_ts, clock, flag,
                          sys_flag, reconsume, max_props, max_body)


def python_record(body: bytes, props: bytes, queue_offset: int, phy_offset: int, flag: int = 0,
                  sys_flag: int = 0, reconsume: int = 0) -> tuple[bytes, bool]:
    """What SendProcessor._send_one + CommitLog.put_message store for a plain send (the reference)."""
    from ferrymq.broker.processors.send import _parse_properties, _properties_text  # noqa: PLC0415
    from ferrymq.common.message import MessageExtBrokerInner  # noqa: PLC0415
    from ferrymq.common.message_codec import encode_record_parts  # noqa: PLC0415

    p = _parse_properties(props.decode("ascii"))
    wait = p.pop("WAIT", "true").lower() != "false"
    p["CLUSTER"] = "DefaultCluster"
    text = _properties_text(p).encode("utf-8")
    inner = MessageExtBrokerInner(topic="TopicA", queue_id=0, body=body, flag=flag, properties_string="",
                                  sys_flag=sys_flag, born_timestamp=TS, born_host=BORN_HOST, store_host=STORE_HOST,
                                  reconsume_times=reconsume)
    return encode_record_parts(inner, b"TopicA", text, queue_offset, phy_offset, TS), wait


def test_put_one_writes_the_python_record() -> None:
    from ferrymq.common.message import encode_offset_msg_id_raw  # noqa: PLC0415

    native = require_extension()
    mm = bytearray(4096) + b"\xee" * 64
    total, wait, msg_id, ts = put1(native, memoryview(mm)[:4096], pos=100, queue_offset=7, phy_offset=1 << 40)
    record, py_wait = python_record(b"abc", ONE_PROPS, 7, 1 << 40)
    assert (total, wait, ts) == (len(record), py_wait, TS) and not wait
    assert mm[100:100 + total] == record and mm[:100] == bytearray(100) and mm[100 + total:4096] == bytes(
        4096 - 100 - total)
    assert mm[4096:] == b"\xee" * 64
    assert msg_id == encode_offset_msg_id_raw(STORE_HOST, 1 << 40)


@pytest.mark.parametrize(("queue_offset", "phy_offset"), [
    (INT64_MAX, 0), (-1, 0), (0, -1), (0, INT64_MAX), (0, INT64_MAX - 100),
])
def test_put_one_offsets_that_would_overflow_int64_are_left_to_python(queue_offset: int, phy_offset: int) -> None:
    native = require_extension()
    mm = bytearray(4096)
    assert put1(native, mm, queue_offset=queue_offset, phy_offset=phy_offset) is None
    assert mm == bytearray(4096)
    total = put1(native, bytearray(4096), queue_offset=INT64_MAX - 1)[0]
    res = put1(native, mm, phy_offset=INT64_MAX - total)
    assert res is not None and res[2] == encode_id(INT64_MAX - total)


def encode_id(phy: int) -> str:
    from ferrymq.common.message import encode_offset_msg_id_raw  # noqa: PLC0415

    return encode_offset_msg_id_raw(STORE_HOST, phy)


@pytest.mark.parametrize(("field", "value"), [
    ("sys_flag", 0x4), ("sys_flag", 0x8), ("sys_flag", 0xC), ("sys_flag", 0x10), ("sys_flag", 0x20),
    ("sys_flag", -1), ("sys_flag", 1 << 31), ("flag", 1 << 31), ("flag", -(1 << 31) - 1), ("reconsume", 1 << 31),
    ("reconsume", -(1 << 31) - 1), ("props", b"DELAY\x013"), ("props", b"DELAY\x010"), ("props", b"TRAN_MSG\x01x"),
    ("props", "TAGS\x01ü".encode()), ("props", b"\x02".join(b"n%d\x01v" % i for i in range(70))),
    ("max_props", 10), ("max_body", 2),
])
def test_put_one_declines_what_python_decides(field: str, value: Any) -> None:
    native = require_extension()
    mm = bytearray(4096)
    assert put1(native, mm, **{field: value}) is None
    assert mm == bytearray(4096)
    # the largest values that still fit are written
    assert put1(native, mm, flag=(1 << 31) - 1, sys_flag=(1 << 31) - 1 - 0x3C, reconsume=-(1 << 31)) is not None


def test_put_one_field_limits() -> None:
    native = require_extension()
    mm = bytearray(4096)
    for kwargs in ({"topic": b""}, {"topic": b"t" * 128}, {"queue_id": -1}, {"pos": -1}, {"max_props": -1},
                   {"max_props": 1 << 15}, {"max_body": -1}):
        with pytest.raises(ValueError):
            put1(native, mm, **kwargs)
    for kwargs in ({"queue_offset": 1 << 63}, {"flag": 1 << 64}, {"born_ts": 1 << 63}):
        with pytest.raises(OverflowError):
            put1(native, mm, **kwargs)
    with pytest.raises(TypeError):
        put1(native, mm, props="TAGS\x01a")
    assert mm == bytearray(4096)


def test_put_one_room_and_short_or_closed_mm() -> None:
    native = require_extension()
    mm = bytearray(4096)
    total = put1(native, bytearray(4096))[0]
    assert put1(native, mm, room=total - 1) == (total, False, None, None)  # roll and call again
    assert put1(native, mm, room=-1)[2] is None
    assert mm == bytearray(4096)
    assert put1(native, mm, room=total)[0] == total
    _assert_short_or_closed_mm_refused(native, put1)


@pytest.mark.parametrize("putter", [put, put1], ids=["put_batch", "put_one"])
def test_clock_errors_write_nothing(putter: Callable[..., Any]) -> None:
    native = require_extension()
    mm = bytearray(4096)

    def boom() -> int:
        raise RuntimeError("clock")

    with pytest.raises(RuntimeError):
        putter(native, mm, clock=boom)
    for bad in ("now", 1.5, None, 1 << 64):
        with pytest.raises((TypeError, OverflowError)):
            putter(native, mm, clock=lambda bad=bad: bad)
    with pytest.raises(TypeError):
        putter(native, mm, clock=None)
    assert mm == bytearray(4096)


def test_put_one_large_properties_and_body_inside_mm() -> None:
    """Properties past the on-stack buffer (heap), a body larger than the GIL-release threshold, and a body that is
    a view of the segment it is written to (as put_batch's)."""
    native = require_extension()
    props = b"KEYS\x01" + b"k" * 5000 + b"\x02TAGS\x01t"
    body = bytes(range(256)) * 1200
    mm = bytearray(len(body) + 8000)
    total, wait, _id, _ts = put1(native, mm, body=body, props=props, phy_offset=5)
    record, py_wait = python_record(body, props, 0, 5)
    assert (total, wait) == (len(record), py_wait) and mm[:total] == record
    mm = bytearray(4096)
    mm[:10] = b"0123456789"
    view = memoryview(mm)[:10]
    res = put1(native, mm, body=view, pos=0)
    view.release()
    assert res is not None and res[0] == 147  # defined (if useless) bytes, no crash


one_item = st.one_of(
    st.tuples(st.sampled_from(["TAGS", "KEYS", "WAIT", "CLUSTER", "UNIQ_KEY", "X"]),
              st.sampled_from(["", "false", "FALSE", "true", "fAlSe", "falsee", "a b", "v\x01w"])).map(
        lambda nv: f"{nv[0]}\x01{nv[1]}"),
    st.sampled_from(["", "\x01", "a", "\x01v", "ab"]),
)


@SETTINGS
@given(items=st.lists(one_item, max_size=8), trailing=st.booleans(), body=st.binary(max_size=300),
       queue_offset=st.integers(0, 1 << 40), phy_offset=st.integers(0, 1 << 50), flag=st.integers(-(1 << 31), (1 << 31) - 1),
       reconsume=st.integers(-(1 << 31), (1 << 31) - 1), room=st.integers(-1, 1200), pos=st.integers(0, 1500))
def test_put_one_matches_the_python_record(items: list[str], trailing: bool, body: bytes, queue_offset: int,
                                           phy_offset: int, flag: int, reconsume: int, room: int, pos: int) -> None:
    native = require_extension()
    props = ("\x02".join(items) + ("\x02" if trailing else "")).encode("ascii")
    guard = b"\xee" * 64
    mm = bytearray(1024) + guard
    record, py_wait = python_record(body, props, queue_offset, phy_offset, flag, 0, reconsume)
    try:
        res = put1(native, memoryview(mm)[:1024], body=body, props=props, pos=pos, room=room,
                   queue_offset=queue_offset, phy_offset=phy_offset, flag=flag, reconsume=reconsume)
    except ValueError:
        assert pos > 1024 or 1024 - pos < len(record)  # room said it fits, mm did not
        res = None
    assert mm[1024:] == guard
    if res is None:
        assert mm[:1024] == bytearray(1024)
        return
    total, wait, msg_id, _ts = res
    assert (total, wait) == (len(record), py_wait)
    if msg_id is None:
        assert total > room and mm[:1024] == bytearray(1024)
    else:
        assert mm[pos:pos + total] == record and msg_id == encode_id(phy_offset)
        assert mm[:pos] == bytearray(pos) and mm[pos + total:1024] == bytearray(1024 - pos - total)


class _IntSub(int):
    pass


class _Index:
    def __init__(self, value: int) -> None:
        self.value = value

    def __index__(self) -> int:
        return self.value


PUT1_ARGS = 19
# (position, junk, the exception): the contract CommitLog.put_one_raw relies on: OverflowError = a field out of
# its record range (the Python path answers), anything else raises as before
_NOT_INT = (1.5, "1", None, b"1", bytearray(b"1"), memoryview(b"1"), object())
_NOT_BYTES = (1, True, 1.5, "TopicA", None, bytearray(b"TopicA"), memoryview(b"TopicA"), object())
_INTS = (1, 2, 6, 7, 8, 12, 14, 15, 16, 17, 18)
_BYTES = (4, 5, 9, 10, 11)


def _put1_args(mm: Any, **over: Any) -> list[Any]:
    args: list[Any] = [mm, 0, len(mm), b"abc", ONE_PROPS, b"TopicA", 0, 0, 0, b"DefaultCluster", BORN_HOST,
                       STORE_HOST, TS, lambda: TS, 0, 0, 0, 32767, 1 << 22]
    for at, value in over.items():
        args[int(at[1:])] = value
    return args


@pytest.mark.parametrize("at", _INTS)
def test_put_one_wrong_int_types_raise_type_error_and_write_nothing(at: int) -> None:
    native = require_extension()
    guard = b"\xee" * 32
    outer = bytearray(guard + bytes(4096) + guard)
    mm = memoryview(outer)[32:-32]
    for junk in _NOT_INT:
        args = _put1_args(mm)
        args[at] = junk
        with pytest.raises(TypeError):
            native.put_one(*args)
    for big in (1 << 64, -(1 << 64), 1 << 80):  # beyond "n" / "L" / "i": OverflowError (the Python path answers)
        args = _put1_args(mm)
        args[at] = big
        with pytest.raises(OverflowError):
            native.put_one(*args)
    assert outer == guard + bytes(4096) + guard


@pytest.mark.parametrize("at", _BYTES)
def test_put_one_wrong_bytes_types_raise_type_error(at: int) -> None:
    native = require_extension()
    mm = bytearray(4096)
    for junk in _NOT_BYTES:
        args = _put1_args(mm)
        args[at] = junk
        with pytest.raises(TypeError):
            native.put_one(*args)
    assert mm == bytearray(4096)


def test_put_one_wrong_argument_counts_and_odd_objects() -> None:
    native = require_extension()
    mm = bytearray(4096)
    args = _put1_args(mm)
    for n in (0, 1, PUT1_ARGS - 1):
        with pytest.raises(TypeError):
            native.put_one(*args[:n])
    with pytest.raises(TypeError):
        native.put_one(*args, 0)
    with pytest.raises(TypeError):  # keywords are not taken
        native.put_one(*args[:-1], max_body=1 << 22)
    for body in (None, 1, "abc"):
        with pytest.raises(TypeError):
            native.put_one(*_put1_args(mm, a3=body))
    for clock in (None, 1, "clock"):  # called only once the record goes in
        with pytest.raises(TypeError):
            native.put_one(*_put1_args(mm, a13=clock))
        assert native.put_one(*_put1_args(mm, a2=-1, a13=clock))[2] is None
    with pytest.raises(BufferError):  # mm must be a writable buffer
        native.put_one(*_put1_args(b"x" * 4096))
    with pytest.raises(TypeError):
        native.put_one(*_put1_args(mm, a0=None))
    assert mm == bytearray(4096)


def test_put_one_int_like_arguments_write_what_exact_ints_write() -> None:
    """bool, int subclasses and __index__ objects take the PyArg_ParseTuple path: same answer, same bytes."""
    native = require_extension()
    ref = bytearray(4096)
    expected = native.put_one(*_put1_args(ref, a6=1, a7=5, a14=1))
    for conv in (_IntSub, _Index, bool):
        mm = bytearray(4096)
        over = {f"a{at}": conv(v) if conv is not bool or v == 1 else v for at, v in ((6, 1), (7, 5), (14, 1), (2, 4096))}
        assert native.put_one(*_put1_args(mm, **over)) == expected
        assert mm == ref


@pytest.mark.parametrize(("pos", "room"), [
    (-1, 4096), (-(1 << 63), 4096), (0, -1), (0, -(1 << 63)), (0, 0), (4096, 4096), (4097, 4096), (4095, 4096),
    (1 << 31, 1 << 31), ((1 << 31) - 1, (1 << 31) - 1), ((1 << 63) - 1, (1 << 63) - 1), (0, (1 << 63) - 1),
    (4000, (1 << 31) - 1), (2000, 1 << 40),
])
def test_put_one_positions_past_the_buffer_never_write_outside_it(pos: int, room: int) -> None:
    native = require_extension()
    guard = bytes(range(256))[:64]
    outer = bytearray(guard + bytes(4096) + guard)
    mm = memoryview(outer)[64:-64]
    try:
        res = native.put_one(*_put1_args(mm, a1=pos, a2=room))
    except ValueError:  # a negative pos, or room says it fits and mm does not
        res = None
    assert outer[:64] == guard and outer[-64:] == guard
    if res is None or res[2] is None:
        assert outer == guard + bytes(4096) + guard
    else:
        total = res[0]
        assert 0 <= pos and pos + total <= 4096 and total <= room
        assert outer[64:64 + pos] == bytes(pos) and outer[64 + pos + total:-64] == bytes(4096 - pos - total)
    for big in (1 << 63, -(1 << 63) - 1):
        with pytest.raises(OverflowError):
            native.put_one(*_put1_args(mm, a1=big))
        with pytest.raises(OverflowError):
            native.put_one(*_put1_args(mm, a2=big))


def test_put_one_body_exactly_fills_the_room() -> None:
    native = require_extension()
    fixed = native.put_one(*_put1_args(bytearray(0), a2=-1, a3=b""))[0]
    for room in (fixed, fixed + 1, 200, 1000):
        for delta in (-1, 0, 1):
            body = b"b" * max(0, room - fixed + delta)
            guard = b"\xee" * 16
            outer = bytearray(bytes(room) + guard)
            res = native.put_one(*_put1_args(memoryview(outer)[:room], a2=room, a3=body))
            assert res[0] == fixed + len(body) and (res[2] is None) == (res[0] > room)
            assert outer[room:] == guard
            if res[2] is None:
                assert outer == bytes(room) + guard


def test_put_one_raising_clock_propagates_and_writes_nothing() -> None:
    native = require_extension()
    mm = bytearray(4096)
    calls = []

    class ClockError(Exception):
        pass

    def boom() -> int:
        calls.append(1)
        raise ClockError("clock")

    with pytest.raises(ClockError):
        native.put_one(*_put1_args(mm, a13=boom))
    assert calls == [1] and mm == bytearray(4096)
    for bad in (_Index(1 << 64), 1 << 63, -(1 << 63) - 1):  # not an int64: OverflowError, nothing written
        with pytest.raises(OverflowError):
            native.put_one(*_put1_args(mm, a13=lambda bad=bad: bad))
    assert mm == bytearray(4096)
    for edge in ((1 << 63) - 1, -(1 << 63), True, _IntSub(5), _Index(6)):  # int64s (and int-likes) are written
        res = native.put_one(*_put1_args(bytearray(4096), a13=lambda edge=edge: edge))
        assert res[3] == int(edge)


def test_put_one_ctypes_arguments_moved_by_the_clock_are_not_read_after_free() -> None:
    """Regression (use after free): "y#" and the body's Py_buffer hand out pointers into a ctypes array without
    locking it; a clock (or an __index__ run while parsing) that ctypes.resize()s it freed that memory before
    the record was written. put_one now copies such arguments to bytes first."""
    import ctypes  # noqa: PLC0415

    native = require_extension()
    expected_mm = bytearray(4096)
    expected = native.put_one(*_put1_args(expected_mm, a3=b"B" * 64, a4=b"KEYS\x01" + b"k" * 40, a5=b"T" * 40))

    def arrays() -> list[Any]:
        return [(ctypes.c_char * len(v)).from_buffer_copy(v) for v in (b"B" * 64, b"KEYS\x01" + b"k" * 40,
                                                                       b"T" * 40)]

    body, props, topic = arrays()

    def clock() -> int:
        for a in (body, props, topic):
            ctypes.resize(a, 1 << 16)
            ctypes.memset(a, 0x55, 1 << 16)
        return TS

    mm = bytearray(4096)
    assert native.put_one(*_put1_args(mm, a3=body, a4=props, a5=topic, a13=clock)) == expected
    assert mm == expected_mm
    body, props, topic = arrays()

    def move() -> None:
        for a in (body, props, topic):
            ctypes.resize(a, 1 << 16)

    class Moving:
        def __index__(self) -> int:
            move()
            return 0

    mm = bytearray(4096)
    assert native.put_one(*_put1_args(mm, a3=body, a4=props, a5=topic, a15=Moving())) == expected
    assert mm == expected_mm


# ---- scan_dispatch --------------------------------------------------------------------------------------


@pytest.mark.parametrize("file_from_offset", [INT64_MAX, INT64_MAX - 10, -1, -(1 << 63)])
def test_scan_phy_offsets_that_would_overflow_are_left_to_python(file_from_offset: int) -> None:
    native = require_extension()
    data = stream()
    assert native.scan_dispatch(data, 0, len(data), 100, file_from_offset, True) == (0, 0, 0, 2, [], b"")
    # the largest base that still fits is scanned
    res = native.scan_dispatch(data, 0, len(data), 100, INT64_MAX - len(data), True)
    assert res[0] == 3 and res[3] == speedups.SCAN_STOP_END


def test_scan_arguments_at_and_past_the_buffer_ends() -> None:
    native = require_extension()
    data = stream()
    n = len(data)
    for pos, end in [(0, n + 1), (-1, n), (0, -1)]:
        with pytest.raises(ValueError):
            native.scan_dispatch(data, pos, end, 10, 0, True)
    assert native.scan_dispatch(data, n + 5, n, 10, 0, True)[:4] == (0, n + 5, 0, speedups.SCAN_STOP_RECORD)
    assert native.scan_dispatch(data, n, n, 10, 0, True)[:4] == (0, n, 0, speedups.SCAN_STOP_END)
    assert native.scan_dispatch(data, 0, n, 0, 0, True)[:4] == (0, 0, 0, speedups.SCAN_STOP_LIMIT)
    with pytest.raises(ValueError):
        native.scan_dispatch(data, 0, n, -1, 0, True)
    m = mmap.mmap(-1, n)
    m.close()
    with pytest.raises(ValueError):
        native.scan_dispatch(m, 0, 0, 10, 0, True)


def test_scan_every_truncation() -> None:
    native = require_extension()
    data = stream(4)
    for cut in range(len(data) + 1):
        for buf in (data[:cut], data):
            records, end_pos, _ts, _stop, runs, index = native.scan_dispatch(buf, 0, cut, 100, 0, True)
            assert end_pos <= cut and len(index) % ENTRY.size == 0
            assert sum(len(units) for *_, units in runs) == 20 * records


@SETTINGS
@given(at=st.integers(0, 400), width=st.sampled_from([1, 2, 4]),
       value=st.sampled_from([-(1 << 31), -1, 0, 1, 90, 91, 127, 128, 0x7FFF, 0x8000, (1 << 31) - 1]),
       end_cut=st.integers(0, 30))
def test_scan_corrupt_length_fields_stay_in_bounds(at: int, width: int, value: int, end_cut: int) -> None:
    native = require_extension()
    buf = bytearray(stream(4))
    at %= len(buf) - width
    buf[at:at + width] = (value & ((1 << 8 * width) - 1)).to_bytes(width, "big")
    end = len(buf) - end_cut
    records, end_pos, _ts, stop, runs, index = native.scan_dispatch(bytes(buf), 0, end, 100, 0, True)
    assert 0 <= end_pos <= end and (stop != speedups.SCAN_STOP_END or end_pos == end)
    assert sum(len(units) for *_, units in runs) == 20 * records


# ---- index_put_many -------------------------------------------------------------------------------------


def _index(slot_num: int = 4, index_num: int = 8) -> bytearray:
    return bytearray(40 + 4 * slot_num + 20 * index_num)


def test_index_bad_hash_writes_nothing() -> None:
    native = require_extension()
    good = ENTRY.pack(100, TS, 5)
    bad = ENTRY.pack(200, TS, 0x80000000)
    mm = _index()
    with pytest.raises(ValueError):
        native.index_put_many(mm, good * 3 + bad, 0, 4, 8, 1, 0, 0, 0)
    assert mm == _index()
    # past what the file can take, a bad entry is not looked at (as before)
    res = native.index_put_many(mm, good * 3 + bad, 0, 4, 4, 1, 0, 0, 0)
    assert res[:3] == (3, 4, 1)
    assert native.index_put_many(mm, bad, 0, 4, 4, 4, 1, 0, 0)[:2] == (0, 4)


@pytest.mark.parametrize("slots_used", [INT64_MAX, -(1 << 63), 1 << 31, -(1 << 31) - 1])
def test_index_hash_slot_count_out_of_int32(slots_used: int) -> None:
    native = require_extension()
    with pytest.raises(ValueError):
        native.index_put_many(_index(), ENTRY.pack(1, TS, 3), 0, 4, 8, 1, slots_used, 0, 0)


def test_index_geometry_and_positions() -> None:
    native = require_extension()
    e = ENTRY.pack(1, TS, 3) * 2
    for args in [(_index()[:-1], e, 0, 4, 8), (_index(), e, 3, 4, 8), (_index(), e, -1, 4, 8), (_index(), e[:-1], 0, 4, 8),
                 (_index(), e, 0, 0, 8), (_index(), e, 0, 4, -1), (_index(), e, 0, 1 << 31, 8)]:
        with pytest.raises(ValueError):
            native.index_put_many(*args, 1, 0, 0, 0)
    with pytest.raises((TypeError, BufferError)):
        native.index_put_many(bytes(_index()), e, 0, 4, 8, 1, 0, 0, 0)
    assert native.index_put_many(_index(), e, 0, 4, 8, 1 << 40, 0, 0, 0)[:2] == (0, 1 << 40)


@SETTINGS
@given(entries=st.lists(st.tuples(st.integers(-(1 << 63), INT64_MAX), st.integers(-(1 << 63), INT64_MAX),
                                  st.integers(0, 0x7FFFFFFF)), max_size=12),
       slot_num=st.integers(1, 9), index_num=st.integers(0, 9), count=st.integers(0, 12),
       slots_used=st.integers(-(1 << 31), 0x7FFFFFFF), start=st.integers(0, 12))
def test_index_writes_stay_in_the_file(entries: list[tuple[int, int, int]], slot_num: int, index_num: int, count: int,
                                       slots_used: int, start: int) -> None:
    native = require_extension()
    packed = b"".join(ENTRY.pack(*e) for e in entries)
    guard = b"\xee" * 32
    size = 40 + 4 * slot_num + 20 * index_num
    mm = bytearray(size) + guard
    try:
        nxt, new_count, *_ = native.index_put_many(memoryview(mm)[:size], packed, start, slot_num, index_num, count,
                                                   slots_used, 0, 0)
    except ValueError:
        assert start > len(entries)
        return
    assert mm[size:] == guard and mm[:40] == bytes(40)  # the header is the caller's
    assert new_count - count == nxt - start and new_count <= max(count, index_num)


# ---- wrong types ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["scan_dispatch", "index_put_many", "put_batch", "put_one"])
def test_wrong_argument_types_raise(name: str) -> None:
    native = require_extension()
    fn = getattr(native, name)
    nargs = {"scan_dispatch": 6, "index_put_many": 9, "put_batch": 18, "put_one": 19}[name]
    for junk in (None, 1.5, "s", object(), 1 << 80, []):
        for i in range(nargs):
            args: list[Any] = [0] * nargs
            args[i] = junk
            with pytest.raises((TypeError, ValueError, OverflowError, BufferError)):
                fn(*args)
    with pytest.raises(TypeError):
        fn()


def test_scan_index_entry_layout() -> None:
    native = require_extension()
    assert native.SCAN_INDEX_ENTRY_SIZE == ENTRY.size == struct.calcsize("=qqI4x")
