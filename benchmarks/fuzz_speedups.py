"""Structured fuzzer for the C extension ``ferrymq.store._speedups`` (not a test: run it by hand).

Feeds the four entry points (``scan_dispatch``, ``index_put_many``, ``put_batch``, ``put_one``) mutations of
valid input made by the repo's own encoders (length fields set to -1, 0, INT32_MAX, off by one; truncation at
every byte; random bytes and splices), position/end/room arguments at and past the buffer ends, odd
``max_records``, wrong argument types, clocks that raise or return non-ints, closed mmaps. ``put_one`` also
gets properties texts (valid ``name\x01value\x02`` items, WAIT / DELAY / TRAN_MSG, truncated, non-ASCII,
huge), bodies sized around the room / the buffer end, every argument position swapped for a bool, float, big
int, bytearray, memoryview, str, None or an int subclass (its PyArg_ParseTuple path), wrong argument counts,
and clocks / ``__index__`` methods that resize ctypes arguments (the borrowed-pointer case); so does
``put_batch`` (ctypes body / topic / properties / cluster / hosts, and clocks that resize them, shrink or close
mm, or re-enter; such a put must write what the same call with bytes writes). Each call must return or raise a
Python exception, and a put writes exactly its record or nothing (checked). The point is to run it under
AddressSanitizer + UBSan, which turn a memory error into an abort (``PYTHONMALLOC=malloc``: pymalloc's own
arenas hold blocks up to 512 bytes, which ASan cannot see freed, e.g. a small resized ctypes array)::

    mkdir /tmp/asan && git -C . archive HEAD | tar -x -C /tmp/asan
    cp src/ferrymq/store/_speedups*.[ch] /tmp/asan/src/ferrymq/store/   # the working copy under test
    cd /tmp/asan && CFLAGS="-fsanitize=address,undefined -fno-sanitize-recover=undefined \\
        -fno-omit-frame-pointer -O1 -g" LDFLAGS="-fsanitize=address,undefined" \\
        python setup.py build_ext --inplace
    PYTHONMALLOC=malloc ASAN_OPTIONS=detect_leaks=0 \\
        LD_PRELOAD=$(gcc -print-file-name=libasan.so):$(gcc -print-file-name=libubsan.so) \\
        PYTHONPATH=/tmp/asan/src python benchmarks/fuzz_speedups.py --cases 300000

``--family put_one`` (or scan, index, batch, types, crc32) runs one family only; the default runs them all.
The ``crc32`` family compares ``crc32`` with ``zlib.crc32``: lengths 0..70000, start offsets 0..127 into a larger
buffer, random initial values, bytes / bytearray / memoryview slices and exact-size ctypes buffers (their last
byte is the allocation's last byte, so an over-read is an ASan report), a tenth of the calls on the forced zlib
fallback, and what non-contiguous or wrong-type arguments raise.
``--leaks`` instead calls each function ~100k times on valid and invalid input and prints the RSS
growth (``/proc/self/statm``) and, on a debug build, ``sys.gettotalrefcount()`` growth.
"""

from __future__ import annotations

import argparse
import ctypes
import mmap
import operator
import os
import random
import struct
import sys
import time
import zlib
from collections.abc import Callable
from typing import Any

from ferrymq.common.message import MessageExtBrokerInner
from ferrymq.common.message_codec import encode_batch_body, encode_record
from ferrymq.store.speedups import EXTENSION

HOST = b"\x7f\x00\x00\x01\x00\x00\x51\xaf"
INT32_EDGES = [-(1 << 31), -2, -1, 0, 1, 2, 90, 91, 127, 128, 32767, 32768, 65535, (1 << 31) - 1]
SSIZE_EDGES = [-(1 << 63), -1, 0, 1, (1 << 62), (1 << 63) - 1]
PROP_TEXTS = ["", "TAGS\x01a", "KEYS\x01k1 k2  k3", "UNIQ_KEY\x01u1\x02TAGS\x01t\x02KEYS\x01 ", "\x01\x02\x02",
              "TAGS\x01\x02KEYS\x01", "WAIT\x01true\x02X\x01y", "DELAY\x013", "a" * 300, "\x02".join(["K\x01v"] * 70)]
TOPICS = ["TopicA", "T", "SCHEDULE_TOPIC_XXXX", "..", "a/b", "t" * 127]


def _record(rng: random.Random, qo: int, phy: int) -> bytes:
    inner = MessageExtBrokerInner(rng.choice(TOPICS), rng.randrange(4), rng.randbytes(rng.randrange(40)),
                                  0, rng.choice(PROP_TEXTS), 0, rng.choice([0, 0, 0, 4, 8, 0xC]),
                                  1_690_000_000_000, HOST, HOST, 0)
    return encode_record(inner, qo, phy, 1_690_000_000_000 + rng.randrange(10**6))


def record_stream(rng: random.Random) -> bytes:
    out = bytearray()
    for i in range(rng.randrange(1, 6)):
        out += _record(rng, i, len(out))
    return bytes(out)


def batch_body(rng: random.Random) -> bytes:
    return encode_batch_body([(rng.choice([0, 1, -1]), rng.randbytes(rng.randrange(60)), rng.choice(PROP_TEXTS))
                              for _ in range(rng.randrange(1, 5))])


def mutate(rng: random.Random, data: bytes, int_offsets: list[int]) -> bytes:
    buf = bytearray(data)
    for _ in range(rng.randrange(1, 4)):
        op = rng.randrange(7)
        if not buf:
            buf += rng.randbytes(rng.randrange(200))
            continue
        if op == 0 and int_offsets:  # a known int32 field set to an edge value (+/- 1)
            off = rng.choice(int_offsets)
            if off + 4 <= len(buf):
                v = rng.choice(INT32_EDGES) + rng.choice([-1, 0, 0, 1])
                struct.pack_into(">I", buf, off, v & 0xFFFFFFFF)
        elif op == 1:  # any int32 / int16 anywhere
            off = rng.randrange(len(buf))
            width = rng.choice([2, 4])
            if off + width <= len(buf):
                v = rng.choice(INT32_EDGES) + rng.choice([-1, 0, 1])
                buf[off:off + width] = (v & ((1 << (8 * width)) - 1)).to_bytes(width, "big")
        elif op == 2:
            del buf[rng.randrange(len(buf) + 1):]
        elif op == 3:
            buf[rng.randrange(len(buf))] = rng.randrange(256)
        elif op == 4:
            at = rng.randrange(len(buf) + 1)
            buf[at:at] = rng.randbytes(rng.randrange(1, 40))
        elif op == 5:
            a = rng.randrange(len(buf))
            b = rng.randrange(len(buf))
            buf[a:a] = buf[b:b + rng.randrange(1, 100)]
        else:
            buf = bytearray(rng.randbytes(rng.randrange(300)))
    return bytes(buf)


def record_int_offsets(data: bytes) -> list[int]:
    """TOTALSIZE, BODYLENGTH and the topic / properties length fields of every (intact) record."""
    out: list[int] = []
    pos = 0
    while pos + 88 <= len(data):
        total = struct.unpack_from(">i", data, pos)[0]
        body_len = struct.unpack_from(">i", data, pos + 84)[0]
        out += [pos, pos + 84, pos + 12, pos + 20, pos + 36]
        t = pos + 88 + body_len
        if 0 <= body_len and t < len(data):
            out += [t - 3, t + data[t] - 2]  # int32 ending at the topic length byte / over the properties length
        if total <= 0:
            break
        pos += total
    return out


def batch_int_offsets(data: bytes) -> list[int]:
    out: list[int] = []
    pos = 0
    while pos + 20 <= len(data):
        total = struct.unpack_from(">i", data, pos)[0]
        body_len = struct.unpack_from(">i", data, pos + 16)[0]
        out += [pos, pos + 16, pos + 18 + body_len]
        if total <= 0:
            break
        pos += total
    return out


def _buffer(rng: random.Random, data: bytes, writable: bool = False) -> Any:
    kind = rng.randrange(4)
    if kind == 0 and not writable:
        return data
    if kind == 1 and data:
        m = mmap.mmap(-1, len(data))
        m[:] = data
        return m
    if kind == 2 and not writable:
        return memoryview(data)
    return bytearray(data)


def _pick(rng: random.Random, good: Any, *bad: Any, p: float = 0.04) -> Any:
    """Mostly the valid value; now and then one of the odd ones (so most calls get deep into the C code)."""
    return rng.choice(bad) if bad and rng.random() < p else good


def _edge(rng: random.Random, n: int) -> int:
    return rng.choice([0, 1, n - 1, n, n + 1, n + 91, -1, rng.randrange(-5, n + 5), rng.choice(SSIZE_EDGES)])


def fuzz_scan(rng: random.Random, native: Any) -> None:
    data = record_stream(rng)
    if rng.random() < 0.7:
        data = mutate(rng, data, record_int_offsets(data))
    buf = _buffer(rng, data)
    n = len(data)
    pos = _pick(rng, 0, _edge(rng, n), p=0.15)
    end = _pick(rng, n, _edge(rng, n), p=0.15)
    max_records = _pick(rng, 1 << 20, 1, 0, -1, 3, rng.choice(SSIZE_EDGES), p=0.15)
    ffo = _pick(rng, rng.choice([0, 1 << 30]), -1, (1 << 63) - 1, -(1 << 63), (1 << 63) - 100, p=0.1)
    try:
        res = native.scan_dispatch(buf, pos, end, max_records, ffo, rng.random() < 0.8)
    except (ValueError, OverflowError):
        return
    records, end_pos, _ts, _stop, runs, index = res
    assert 0 <= records and (records == 0 or pos <= end_pos <= end), res[:4]
    assert len(index) % native.SCAN_INDEX_ENTRY_SIZE == 0
    for _topic, _qid, _qo, units in runs:
        assert len(units) % 20 == 0
    if rng.random() < 0.3 and index:  # feed the entries to the index writer too
        fuzz_index(rng, native, index)


def fuzz_index(rng: random.Random, native: Any, entries: bytes | None = None) -> None:
    size = native.SCAN_INDEX_ENTRY_SIZE
    if entries is None:
        entries = b"".join(struct.pack("=qqI4x", rng.randrange(-(1 << 63), 1 << 63), rng.randrange(-(1 << 63), 1 << 63),
                                       _pick(rng, rng.randrange(1 << 31), 0, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF))
                           for _ in range(rng.randrange(8)))
    if rng.random() < 0.1:
        entries = mutate(rng, entries, [])
    slot_num = _pick(rng, rng.choice([1, 2, 7, 100]), 0, -1, 1 << 31, (1 << 31) - 1, p=0.1)
    index_num = _pick(rng, rng.choice([0, 1, 3, 50]), -1, 1 << 31, (1 << 31) - 1, p=0.1)
    need = 40 + max(slot_num, 0) * 4 + max(index_num, 0) * 20
    mm_len = _pick(rng, need, need - 1, need + 1, 0, 40, p=0.2) if need < 1 << 20 else rng.choice([0, 4096])
    mm_len = max(mm_len, 0)
    mm = _buffer(rng, bytes(mm_len), writable=True) if mm_len else bytearray()
    n = len(entries) // size
    count = _pick(rng, rng.choice([0, 1, 2, index_num - 1]), index_num, index_num + 1, -1, (1 << 63) - 1, p=0.2)
    try:
        native.index_put_many(mm, entries, _pick(rng, 0, n, n + 1, -1, 1, p=0.2), slot_num, index_num, count,
                              _pick(rng, count, 0, -1, (1 << 63) - 1, -(1 << 63), p=0.2),
                              _pick(rng, 1_690_000_000_000, 0, -(1 << 63), (1 << 63) - 1, p=0.2),
                              _pick(rng, 0, -1, (1 << 63) - 1, p=0.2))
    except (ValueError, OverflowError):
        pass


def _clock(rng: random.Random) -> Callable[[], Any]:
    kind = rng.randrange(40)
    if kind == 0:
        def boom() -> int:
            raise RuntimeError("clock")
        return boom
    if kind == 1:
        return lambda: "now"
    if kind == 2:
        return lambda: 1 << 70
    if kind == 3:
        return lambda: 1.5
    if kind == 4:
        return lambda: None
    return lambda: 1_690_000_000_000


#: put_batch's "y#" / buffer arguments (body, topic, merge_props, cluster, born_host, store_host) and its
#: integer arguments parsed after some of them (an __index__ there runs with their pointers taken)
BATCH_BUFFER_ARGS = (3, 4, 8, 9, 10, 11)
BATCH_LATE_INTS = (5, 6, 7, 12, 14, 15, 16, 17)


def fuzz_batch(rng: random.Random, native: Any) -> None:
    data = batch_body(rng)
    if rng.random() < 0.7:
        data = mutate(rng, data, batch_int_offsets(data))
    body = _ctypes_bytes(data) if rng.random() < 0.05 else _buffer(rng, data)
    mm_len = rng.choice([0, 1, 64, 1024, 4096, rng.randrange(2000)])
    mm: Any = _buffer(rng, bytes(mm_len), writable=True) if mm_len else bytearray()
    if mm_len and rng.random() < 0.03:
        mm = (ctypes.c_char * mm_len)()
    closed = False
    if isinstance(mm, mmap.mmap) and rng.random() < 0.1:
        mm.close()
        closed = True
    pos = _pick(rng, rng.choice([0, 0, rng.randrange(mm_len + 1)]), _edge(rng, mm_len), p=0.1)
    room = _pick(rng, mm_len - max(pos, 0), mm_len, 1 << 40, -1, 0, _edge(rng, mm_len), p=0.2)
    topic = _pick(rng, b"TopicA", b"t" * 127, b"t" * 128, b"", b"a\x00b", "é".encode(), "TopicA", p=0.1)
    merge = _pick(rng, rng.choice([b"", b"TAGS\x01m", b"WAIT\x01false\x02KEYS\x01a b"]),
                  b"\x02".join([b"M\x01v"] * 70), b"DELAY\x011", "é\x01x".encode(), b"x" * 40000, p=0.1)
    cluster = _pick(rng, b"DefaultCluster", b"", b"c" * 33000, p=0.1)
    args: list[Any] = [
        mm, pos, room, body, topic, _pick(rng, 3, 0, -1, (1 << 31) - 1, 1 << 31),
        _pick(rng, 7, 0, -1, (1 << 63) - 1, (1 << 63) - 2, 1 << 63),
        _pick(rng, 4096, 0, -1, (1 << 63) - 1, (1 << 63) - 200, -(1 << 63)),
        merge, cluster, _pick(rng, HOST, HOST[:7], HOST + b"x", bytearray(HOST)), HOST,
        _pick(rng, 1, 0, -1, (1 << 63) - 1), None, _pick(rng, 0, 0x30, -1, 0xC),
        _pick(rng, 0, -1, 1 << 31, -(1 << 40)), _pick(rng, 32767, 0, 100, -1, 40000),
        _pick(rng, 4 << 20, 0, 50, -1, (1 << 63) - 1),
    ]
    for i in BATCH_BUFFER_ARGS[1:]:  # ctypes for the "y#" arguments (copied before parsing)
        if rng.random() < 0.03 and isinstance(args[i], bytes):
            args[i] = _ctypes_bytes(args[i])
    # the same call with every ctypes argument as the bytes it holds now: what a put must write
    plain = [bytes(memoryview(a)) if i in BATCH_BUFFER_ARGS and isinstance(a, ctypes.Array) else a
             for i, a in enumerate(args)]
    args[13] = _put_clock(rng, mm, args, native.put_batch) if rng.random() < 0.5 else _clock(rng)
    if any(isinstance(args[i], ctypes.Array) for i in BATCH_BUFFER_ARGS) and rng.random() < 0.3:
        def resize_args() -> int:  # moves the ctypes arguments between validation and the write
            for a in args:
                _resize(a)
            return 1_690_000_000_000
        args[13] = resize_args
    moving_index = rng.random() < 0.03
    if moving_index:  # an __index__ that moves the ctypes arguments while they are being parsed
        at = rng.choice(BATCH_LATE_INTS)
        args[at] = Index(args[at], lambda: [_resize(a) for a in args] and None)
    junked = rng.random() < 0.03
    if junked:  # a wrong type at any position
        junk = rng.choice(PUT_JUNK)
        args[rng.randrange(len(args))] = _ctypes_bytes(HOST) if junk == "ctypes" else junk
    if rng.random() < 0.01:
        args = args[:rng.randrange(len(args))] if rng.random() < 0.7 else args + [0]
    pinned = not junked and len(args) == len(plain) and any(isinstance(args[i], ctypes.Array) for i in BATCH_BUFFER_ARGS)
    try:
        res = native.put_batch(*args)
    except (ValueError, OverflowError, TypeError, RuntimeError, BufferError, ZeroDivisionError):
        res = None
    if pinned and res is not None and res[2] is not None and isinstance(mm, bytearray | ctypes.Array):
        # ctypes arguments (moved by the clock or an __index__ or not) write what bytes write
        # (a ctypes mm resized by the clock: its buffer is b_size long, not len() / its memoryview's shape)
        now = ctypes.string_at(ctypes.addressof(mm), memoryview(mm).nbytes) if isinstance(mm, ctypes.Array) else mm
        ref = bytearray(len(now))
        store_ts = res[4]
        plain[0], plain[13] = ref, lambda: store_ts
        for i in range(len(args)):
            if isinstance(args[i], Index):
                plain[i] = args[i].value
            elif i not in BATCH_BUFFER_ARGS and i not in (0, 13):
                plain[i] = args[i]
        expected = native.put_batch(*plain)
        start, total = operator.index(args[1]), res[1]
        assert expected == res, (expected, res)
        assert bytes(now[start:start + total]) == bytes(ref[start:start + total])
    if not closed and isinstance(mm, mmap.mmap):
        mm.close()
    if isinstance(body, mmap.mmap):
        body.close()


class IntSub(int):
    """An int that is not exact: put_one's PyArg_ParseTuple path, which must answer as its fast path."""


class Index:
    """Not an int, but convertible (``__index__``): what it returns, after running ``side`` (PyArg_ParseTuple
    calls it while earlier arguments' pointers are already taken)."""

    def __init__(self, value: Any, side: Callable[[], None] | None = None) -> None:
        self.value = value
        self.side = side

    def __index__(self) -> Any:
        if self.side is not None:
            self.side()
        if isinstance(self.value, BaseException):
            raise self.value
        return self.value


PUT_NAMES = ["TAGS", "KEYS", "WAIT", "WAIT", "CLUSTER", "UNIQ_KEY", "X", "", "WAITX", "wait"]  # + DELAY, TRAN_MSG
PUT_VALUES = ["", "false", "FALSE", "fAlSe", "true", "falsee", "fals", "3", "a b  c", "x" * 90, "v\x01w"]
PUT_PROPS = [b"", b"TAGS\x01a\x02KEYS\x01k1 k2\x02WAIT\x01false", b"WAIT\x01true", b"WAIT\x01", b"DELAY\x013",
             b"TRAN_MSG\x01true", b"CLUSTER\x01x\x02CLUSTER\x01y", b"\x01\x02\x02", b"\x02WAIT\x01false\x02"]
INT64_EDGES = [-(1 << 63) - 1, -(1 << 63), -1, 0, 1, (1 << 31) - 1, 1 << 31, (1 << 63) - 201, (1 << 63) - 2,
               (1 << 63) - 1, 1 << 63, 1 << 64]
#: a wrong-typed argument (any position): bool / IntSub / Index are ints for PyArg_ParseTuple, the rest are not
#: (or not for that position)
PUT_JUNK: list[Any] = [True, False, 1.5, 1 << 80, -(1 << 80), bytearray(b"TopicA"), memoryview(b"TopicA"), "TopicA",
                       None, object(), IntSub(3), IntSub(1 << 70), Index(4), Index(1 << 70), Index(ValueError("ix")),
                       Index("x"), b"", "ctypes"]  # "ctypes": a fresh ctypes array (a writable buffer, resizable)


def put_props(rng: random.Random) -> bytes:
    kind = rng.randrange(14)
    if kind < 8:  # valid items (the last occurrence wins; WAIT taken out; DELAY / TRAN_MSG declined)
        names = [_pick(rng, rng.choice(PUT_NAMES), "DELAY", "TRAN_MSG", p=0.03) for _ in range(rng.randrange(8))]
        text = "\x02".join(f"{name}\x01{rng.choice(PUT_VALUES)}" for name in names)
        return (text + rng.choice(["", "", "\x02"])).encode()
    valid = rng.choice(PUT_PROPS + [t.encode() for t in PROP_TEXTS])
    if kind == 4:
        return mutate(rng, valid, [])
    if kind == 5:  # truncated anywhere
        return valid[:rng.randrange(len(valid) + 1)]
    if kind == 6:  # non-ASCII somewhere
        at = rng.randrange(len(valid) + 1)
        return valid[:at] + rng.choice(["é".encode(), b"\x80", b"\xff\x01"]) + valid[at:]
    if kind == 7:  # huge: many items, one long value, past the int16 properties limit
        return rng.choice([b"\x02".join([b"K\x01v"] * rng.choice([63, 64, 65, 70, 500])),
                           b"KEYS\x01" + b"k" * rng.choice([1000, 1015, 1024, 5000, 32700, 40000]),
                           b"TAGS\x01t\x02" * 3000])
    if kind == 8:
        return rng.randbytes(rng.randrange(300))
    if kind == 9:
        return bytes(rng.choice(b"\x01\x02ab=") for _ in range(rng.randrange(60)))
    return valid


def _ctypes_bytes(data: bytes) -> Any:
    """A ctypes array over a copy of data (a buffer with no bf_releasebuffer: "y#" hands out a borrowed pointer,
    and ctypes.resize can move it). Its memory is malloc'd, so a resize frees it: arrays of at most 16 bytes
    live inside the object, so short ones (the hosts) are grown past that and shrunk back (the size shrinks,
    the memory stays on the heap)."""
    data = data or b"\x00"
    arr = (ctypes.c_char * 1)()
    ctypes.resize(arr, max(len(data), 17))
    if len(data) <= 16:
        ctypes.resize(arr, len(data))
    ctypes.memmove(arr, data, len(data))
    return arr


def _resize(obj: Any) -> None:
    if isinstance(obj, ctypes.Array):
        ctypes.resize(obj, ctypes.sizeof(obj) + 4096)


def _put_clock(rng: random.Random, mm: Any, args: list[Any], put: Callable[..., Any]) -> Callable[[], Any]:
    """put_one's / put_batch's clock (argument 13 of both): odd values, or side effects on the arguments."""
    kind = rng.randrange(30)
    if kind == 0:  # moves every ctypes argument (body, props, topic, cluster, hosts) before the write
        def resize_args() -> int:
            for a in args:
                _resize(a)
            return 1_690_000_000_000
        return resize_args
    if kind == 1 and isinstance(mm, bytearray):  # mm is not exported yet: the new length is the one checked
        def shrink() -> int:
            del mm[len(mm) // 2:]
            return 5
        return shrink
    if kind == 2 and isinstance(mm, mmap.mmap):
        def close() -> int:
            mm.close()
            return 5
        return close
    if kind == 3:  # re-entered with the same arguments (a well-behaved clock this time)
        def reenter() -> int:
            inner = list(args)
            inner[13] = lambda: 7
            try:
                put(*inner)
            except (ValueError, OverflowError, TypeError, BufferError):
                pass
            return 8
        return reenter
    if kind < 10:
        value = rng.choice(INT64_EDGES + [True, IntSub(9), Index(9), Index(1 << 64), Index(RuntimeError("ix")),
                                          "now", 1.5, None])
        return lambda: value
    return _clock(rng)


def fuzz_put_one(rng: random.Random, native: Any) -> None:
    guard = rng.randbytes(rng.randrange(0, 24))
    mm_len = rng.choice([0, 1, 91, 160, 512, 1024, 1024, 4096, 4096, rng.randrange(2000)])
    outer = bytearray(guard + bytes(mm_len) + guard)
    kind = rng.randrange(8)
    mm: Any
    if kind < 4:
        mm = memoryview(outer)[len(guard):len(guard) + mm_len]  # bytes either side must stay as they were
    elif kind < 6 or not mm_len:
        mm = bytearray(mm_len)
    elif kind == 6:
        mm = mmap.mmap(-1, mm_len)
    else:
        mm = _pick(rng, bytes(mm_len), (ctypes.c_char * mm_len)(), p=0.5)  # read-only / a ctypes array
    closed = isinstance(mm, mmap.mmap) and rng.random() < 0.05
    if closed:
        mm.close()
    props = put_props(rng)
    topic = _pick(rng, rng.choice([b"TopicA", b"T", b"t" * 127]), b"t" * 128, b"", "é".encode(), b"a\x00b", p=0.05)
    cluster = _pick(rng, b"DefaultCluster", b"", "é".encode(), b"c" * 33000, b"C\x01\x02", p=0.05)
    pos = _pick(rng, rng.choice([0, 0, rng.randrange(mm_len + 1)]), _edge(rng, mm_len), 1 << 63, (1 << 31) - 1,
                p=0.1)
    real_room = mm_len - pos
    room = _pick(rng, real_room, mm_len, 0, -1, (1 << 31) - 1, 1 << 40, _edge(rng, mm_len), 1 << 63, p=0.15)
    # the body sized around the room / the buffer end: the record of an empty body tells its fixed part
    base_args = [bytearray(64), 0, -1, b"", props, topic, 0, 0, 0, cluster, HOST, HOST, 0, lambda: 0, 0, 0, 0,
                 32767, 1 << 22]
    try:
        sized = native.put_one(*base_args)
    except (ValueError, OverflowError, TypeError):
        sized = None
    fixed = sized[0] if sized is not None else 91 + len(topic) + len(props)
    target = rng.choice([room, real_room, mm_len]) if rng.random() < 0.8 else rng.randrange(5000)
    body_len = target - fixed + rng.choice([-2, -1, 0, 0, 0, 1, 2, -rng.randrange(500), rng.randrange(-50, 50)])
    if rng.random() < 0.003:
        body_len = rng.choice([256 * 1024 - 1, 256 * 1024, 300_000])  # the GIL-released copy
    body_len = max(0, min(body_len, 1 << 20))
    data = rng.randbytes(body_len)
    bkind = rng.randrange(12)
    if bkind == 0:
        body: Any = bytearray(data)
    elif bkind == 1:
        body = memoryview(data)
    elif bkind == 2 and data:
        body = mmap.mmap(-1, len(data))
        body[:] = data
    elif bkind == 3:
        body = _ctypes_bytes(data)
    elif bkind == 4 and isinstance(mm, memoryview | bytearray) and mm_len:  # a view of the segment itself
        body = memoryview(mm)[rng.randrange(mm_len):]
    else:
        body = data
    args: list[Any] = [
        mm, pos, room, body, props, topic,
        _pick(rng, 3, 0, -1, (1 << 31) - 1, 1 << 31, -(1 << 31) - 1, p=0.03),
        _pick(rng, 7, *INT64_EDGES, p=0.05),
        _pick(rng, rng.choice([0, 4096, 1 << 40]), *INT64_EDGES, p=0.05),
        cluster, _pick(rng, HOST, HOST[:7], HOST + b"x", b"", p=0.03), _pick(rng, HOST, HOST[:7], p=0.03),
        _pick(rng, 1, *INT64_EDGES, p=0.03), None,
        _pick(rng, 0, *INT64_EDGES, -(1 << 31) - 1, p=0.03),
        _pick(rng, 0, 0x4, 0x8, 0xC, 0x10, 0x20, 0x30, -1, (1 << 31) - 1, (1 << 31) - 1 - 0x3C, 1 << 31, p=0.05),
        _pick(rng, 0, *INT64_EDGES, p=0.03),
        _pick(rng, 32767, 0, 10, 100, -1, 32768, (1 << 63) - 1, p=0.05),
        _pick(rng, 4 << 20, 0, 2, 50, -1, (1 << 63) - 1, 1 << 63, p=0.05),
    ]
    for i in (4, 5, 9, 10, 11):  # ctypes for the "y#" arguments (copied before parsing)
        if rng.random() < 0.02:
            args[i] = _ctypes_bytes(args[i])
    args[13] = _put_clock(rng, mm, args, native.put_one)
    if rng.random() < 0.06:  # a wrong type at any position
        junk = rng.choice(PUT_JUNK)
        args[rng.randrange(len(args))] = _ctypes_bytes(HOST) if junk == "ctypes" else junk
    if rng.random() < 0.02:  # an __index__ that moves the ctypes arguments while they are being parsed
        at = rng.choice([6, 7, 8, 12, 14, 15, 16, 17, 18])
        args[at] = Index(args[at] if isinstance(args[at], int) else 0, lambda: [_resize(a) for a in args] and None)
    if rng.random() < 0.02:
        args = args[:rng.randrange(len(args))] if rng.random() < 0.7 else args + [0]
    before = bytes(outer)
    snapshot = bytes(mm) if isinstance(mm, bytearray) else None
    try:
        res = native.put_one(*args)
    except (ValueError, OverflowError, TypeError, RuntimeError, BufferError, ZeroDivisionError):
        res = None
    written = res is not None and res[2] is not None
    if args and args[0] is not mm:  # a wrong type took mm's place
        assert outer == before
    elif isinstance(mm, memoryview):
        if written:  # exactly the record at pos (a body that is a view of mm only changes what is copied)
            total, pos, room = res[0], operator.index(args[1]), operator.index(args[2])
            start = len(guard) + pos
            assert 0 < total <= room and pos + total <= mm_len, (res, pos, room, mm_len)
            assert outer[:start] == before[:start] and outer[start + total:] == before[start + total:]
            assert struct.unpack_from(">i", outer, start)[0] == total
        else:
            assert outer == before, (res, args[1:3], mm_len)
    elif snapshot is not None and not written and len(mm) == len(snapshot):
        assert bytes(mm) == snapshot
    if isinstance(mm, mmap.mmap) and not mm.closed:
        mm.close()
    if isinstance(body, mmap.mmap):
        body.close()


def fuzz_types(rng: random.Random, native: Any) -> None:
    junk = [None, 1, -1, 1.5, "s", b"b", bytearray(4), object(), [], (1 << 80)]
    for fn, nargs in ((native.scan_dispatch, 6), (native.index_put_many, 9), (native.put_batch, 18),
                      (native.put_one, 19)):
        args = [rng.choice(junk) for _ in range(rng.choice([nargs, nargs, 0, nargs - 1, nargs + 1]))]
        try:
            fn(*args)
        except (TypeError, ValueError, OverflowError, BufferError, RuntimeError):
            pass


CRC_MAX_LEN = 70_000
#: the crc32 inputs are slices of these (at offsets 0..127, so every alignment)
_CRC_POOL = random.Random(0).randbytes(CRC_MAX_LEN + 128)
_CRC_POOL_RW = bytearray(_CRC_POOL)
CRC_JUNK: list[Any] = ["text", None, 1.5, 7, [], object()]


def _crc_outcome(fn: Callable[..., int], *args: Any) -> tuple[str, Any]:
    try:
        return "ok", fn(*args)
    except Exception as exc:  # noqa: BLE001 - the exception type is what is compared
        return type(exc).__name__, None


def fuzz_crc32(rng: random.Random, native: Any) -> None:
    r = rng.random()
    n = rng.randrange(300) if r < 0.45 else rng.randrange(4097) if r < 0.8 else rng.randrange(CRC_MAX_LEN + 1)
    if rng.random() < 0.2:  # around the 16-byte block and the 64-byte step
        n = max(0, min(CRC_MAX_LEN, rng.choice([16, 64, 128, 1024, 65536]) * rng.randrange(1, 4) + rng.randrange(-3, 4)))
    start = rng.randrange(128)
    value = rng.choice([0, 0xFFFFFFFF, rng.getrandbits(32), rng.randrange(-(1 << 40), 1 << 40)])
    kind = rng.randrange(6)
    obj: Any
    if kind == 0:
        obj = _CRC_POOL[start : start + n]
    elif kind == 1:
        obj = bytearray(_CRC_POOL[start : start + n])
    elif kind == 2:
        obj = memoryview(_CRC_POOL)[start : start + n]
    elif kind == 3:
        obj = memoryview(_CRC_POOL_RW)[start : start + n]
    else:  # exactly n bytes of malloc'd memory (n > 16; shorter ctypes arrays live inside the object)
        obj = _ctypes_bytes(_CRC_POOL[start : start + n]) if n > 16 else _CRC_POOL[start : start + n]
    forced = rng.random() < 0.1
    if forced:
        native._crc32_force_fallback(True)
    try:
        args = (obj, value) if rng.random() < 0.8 else (obj,)
        assert native.crc32(*args) == zlib.crc32(*args), (kind, n, start, args[1:], forced)
        if n and rng.random() < 0.3:  # a running crc over two pieces
            view = memoryview(obj).cast("B")
            cut = rng.randrange(n + 1)
            assert native.crc32(view[cut:], native.crc32(view[:cut], value)) == zlib.crc32(view, value)
        if rng.random() < 0.05:  # arguments zlib refuses: the same exception type
            bad: list[Any] = rng.choice([[memoryview(_CRC_POOL_RW)[start : start + n : 2]], [rng.choice(CRC_JUNK)],
                                         [obj, rng.choice(CRC_JUNK)], [], [obj, 0, 0]])
            got_bad, want_bad = _crc_outcome(native.crc32, *bad), _crc_outcome(zlib.crc32, *bad)
            assert got_bad[0] == want_bad[0] and got_bad == want_bad, (bad, got_bad, want_bad)
    finally:
        if forced:
            native._crc32_force_fallback(False)


#: the case families and their share of a default run
FAMILIES: dict[str, tuple[Callable[[random.Random, Any], None], int]] = {
    "scan": (fuzz_scan, 4), "index": (fuzz_index, 2), "batch": (fuzz_batch, 3), "put_one": (fuzz_put_one, 3),
    "types": (fuzz_types, 1), "crc32": (fuzz_crc32, 2),
}


def run_cases(native: Any, cases: int, seed: int, family: str = "all") -> None:
    rng = random.Random(seed)
    start = time.perf_counter()
    names = list(FAMILIES) if family == "all" else [family]
    schedule = [name for name in names for _ in range(FAMILIES[name][1])]
    counts = dict.fromkeys(names, 0)
    for i in range(cases):
        name = schedule[i % len(schedule)]
        FAMILIES[name][0](rng, native)
        counts[name] += 1
        if i and i % 50000 == 0:
            print(f"{i} cases, {time.perf_counter() - start:.0f}s", flush=True)
    print(f"done: {counts} in {time.perf_counter() - start:.0f}s (seed {seed})")


def truncations(native: Any, seed: int, family: str = "all") -> None:
    """Every prefix of a few valid streams, batch bodies and properties texts (the torn tail of a segment / a
    short read)."""
    rng = random.Random(seed)
    if family in ("all", "crc32"):  # every length 0..300 at every start alignment, exact-size buffers
        for n in range(301):
            for start in range(64):
                for value in (0, 0xFFFFFFFF):
                    data = _ctypes_bytes(_CRC_POOL[start : start + n]) if n > 16 else _CRC_POOL[start : start + n]
                    assert native.crc32(data, value) == zlib.crc32(data, value), (n, start, value)
        if family == "crc32":
            print("truncations done")
            return
    if family in ("all", "put_one"):
        mm = bytearray(4096)
        for props in (PUT_PROPS[1], b"UNIQ_KEY\x01u1\x02WAIT\x01FALSE\x02TAGS\x01t\x02KEYS\x01a b",
                      b"\x02".join([b"K\x01v"] * 70)):
            for cut in range(len(props) + 1):
                for room in (-1, 4096):
                    native.put_one(mm, 0, room, b"body", props[:cut], b"TopicA", 0, 0, 0, b"C", HOST, HOST, 0,
                                   lambda: 1, 0, 0, 0, 32767, 1 << 22)
        if family == "put_one":
            print("truncations done")
            return
    for _ in range(50):
        data = record_stream(rng)
        for cut in range(len(data) + 1):
            native.scan_dispatch(data[:cut], 0, cut, 1 << 20, 0, True)
            native.scan_dispatch(data, 0, cut, 1 << 20, 0, True)
        body = batch_body(rng)
        mm = bytearray(4096)
        for cut in range(len(body) + 1):
            native.put_batch(mm, 0, 4096, body[:cut], b"TopicA", 0, 0, 0, b"", b"C", HOST, HOST, 0,
                             lambda: 1, 0, 0, 32767, 1 << 22)
    print("truncations done")


def _rss_kib() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * (os.sysconf("SC_PAGE_SIZE") // 1024)


def leaks(native: Any, calls: int, family: str = "all") -> None:
    rng = random.Random(1)
    stream = record_stream(rng) + _record(rng, 9, 0)
    bad_stream = stream[:-1]
    body = batch_body(rng)
    entries = struct.pack("=qqI4x", 1, 2, 3) * 4
    mm = bytearray(1 << 16)
    imm = bytearray(40 + 4 * 16 + 20 * 100)

    def boom() -> int:
        raise RuntimeError

    props = b"TAGS\x01a\x02KEYS\x01k1 k2\x02WAIT\x01false"
    big_props = b"KEYS\x01" + b"k" * 2000  # the heap scratch

    def one(mm: Any = mm, room: int = 1 << 16, body: Any = b"body", props: Any = props, clock: Any = lambda: 5,
            topic: Any = b"TopicA", flag: Any = 0) -> Any:
        return native.put_one(mm, 0, room, body, props, topic, 0, 0, 0, b"C", HOST, HOST, 0, clock, flag, 0, 0,
                              32767, 1 << 22)

    ct_topic = (ctypes.c_char * 40).from_buffer_copy(b"T" * 40)
    cases: dict[str, Callable[[], Any]] = {
        "put_one ok": one,
        "put_one heap": lambda: one(props=big_props),
        "put_one slow": lambda: one(flag=True, body=bytearray(b"body")),
        "put_one pin": lambda: one(topic=ct_topic, body=_ctypes_bytes(b"b" * 40)),
        "put_one none": lambda: one(props=b"DELAY\x013"),
        "put_one room": lambda: one(room=10),
        "put_one clock": lambda: one(clock=boom),
        "put_one nonint": lambda: one(clock=lambda: "x"),
        "put_one huge": lambda: one(clock=lambda: 1 << 70),
        "put_one nofit": lambda: one(mm=bytearray(10)),
        "put_one type": lambda: one(props="TAGS\x01a"),
        "put_one nargs": lambda: native.put_one(mm, 0, 1),
        "scan ok": lambda: native.scan_dispatch(stream, 0, len(stream), 100, 0, True),
        "scan bad": lambda: native.scan_dispatch(bad_stream, 0, len(bad_stream), 100, 0, True),
        "scan err": lambda: native.scan_dispatch(stream, 0, len(stream) + 1, 100, 0, True),
        "index ok": lambda: native.index_put_many(imm, entries, 0, 16, 100, 1, 0, 0, 0),
        "index err": lambda: native.index_put_many(imm, entries + b"x", 0, 16, 100, 1, 0, 0, 0),
        "batch ok": lambda: native.put_batch(mm, 0, 1 << 16, body, b"TopicA", 0, 0, 0, b"A\x01b", b"C", HOST, HOST,
                                             0, lambda: 5, 0, 0, 32767, 1 << 22),
        "batch none": lambda: native.put_batch(mm, 0, 1 << 16, body[:-1], b"TopicA", 0, 0, 0, b"", b"C", HOST, HOST,
                                               0, lambda: 5, 0, 0, 32767, 1 << 22),
        "batch pin": lambda: native.put_batch(mm, 0, 1 << 16, _ctypes_bytes(body), ct_topic, 0, 0, 0,
                                              _ctypes_bytes(b"A\x01b"), b"C", HOST, _ctypes_bytes(HOST), 0,
                                              lambda: 5, 0, 0, 32767, 1 << 22),
        "batch clock": lambda: native.put_batch(mm, 0, 1 << 16, body, b"TopicA", 0, 0, 0, b"", b"C", HOST, HOST,
                                                0, boom, 0, 0, 32767, 1 << 22),
        "batch nonint": lambda: native.put_batch(mm, 0, 1 << 16, body, b"TopicA", 0, 0, 0, b"", b"C", HOST, HOST,
                                                 0, lambda: "x", 0, 0, 32767, 1 << 22),
        "crc32 short": lambda: native.crc32(b"body", 5),
        "crc32 long": lambda: native.crc32(memoryview(_CRC_POOL)[3:70003], 5),
        "crc32 err": lambda: native.crc32(memoryview(_CRC_POOL_RW)[::2]),
        "crc32 value": lambda: native.crc32(body, "x"),
        "batch nofit": lambda: native.put_batch(bytearray(10), 0, 1 << 16, body, b"TopicA", 0, 0, 0, b"", b"C", HOST,
                                                HOST, 0, lambda: 5, 0, 0, 32767, 1 << 22),
    }
    # references kept on the arguments / the clock's result show up in their own counts on any build
    now = 1_690_000_000_123
    pinned = (stream, body, entries, mm, imm, now)
    before = [sys.getrefcount(o) for o in pinned]
    for _ in range(calls // 10):
        native.put_batch(mm, 0, 1 << 16, body, b"TopicA", 0, 0, 0, b"", b"C", HOST, HOST, 0, lambda: now, 0, 0,
                         32767, 1 << 22)
        native.put_batch(mm, 0, 1 << 16, body[:-1], b"TopicA", 0, 0, 0, b"", b"C", HOST, HOST, 0, lambda: now, 0,
                         0, 32767, 1 << 22)
        native.scan_dispatch(stream, 0, len(stream), 100, 0, True)
        native.index_put_many(imm, entries, 0, 16, 100, 1, 0, 0, 0)
        native.put_one(mm, 0, 1 << 16, body, props, b"TopicA", 0, 0, 0, b"C", HOST, HOST, 0, lambda: now, 0, 0, 0,
                       32767, 1 << 22)
        native.put_one(mm, 0, 1 << 16, body, props, b"TopicA", False, 0, 0, b"C", HOST, HOST, 0, lambda: now, 0, 0,
                       0, 32767, 1 << 22)
    after = [sys.getrefcount(o) for o in pinned]
    print(f"argument refcounts before {before} after {after}")
    refcount: Callable[[], int] | None = getattr(sys, "gettotalrefcount", None)
    for name, fn in cases.items():
        if family != "all" and not name.startswith(family + " "):
            continue
        for _ in range(1000):  # warm up allocator pools
            try:
                fn()
            except Exception:  # noqa: BLE001 - the error paths are the point
                pass
        rss0 = _rss_kib()
        ref0 = refcount() if refcount else 0
        for _ in range(calls):
            try:
                fn()
            except Exception:  # noqa: BLE001
                pass
        grew = _rss_kib() - rss0
        ref = f", refs {refcount() - ref0:+d}" if refcount else ""
        print(f"{name:14s} {calls} calls: RSS {grew:+d} KiB{ref}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=int(time.time()))
    ap.add_argument("--leaks", action="store_true", help="RSS / refcount growth over --calls calls per case")
    ap.add_argument("--calls", type=int, default=100_000)
    ap.add_argument("--family", choices=["all", *FAMILIES], default="all", help="run one case family only")
    args = ap.parse_args()
    native = EXTENSION
    if native is None:
        sys.exit("ferrymq.store._speedups is not built")
    print(f"extension: {native.__file__}")
    if args.leaks:
        leaks(native, args.calls, args.family)
        return
    truncations(native, args.seed, args.family)
    run_cases(native, args.cases, args.seed, args.family)


if __name__ == "__main__":
    main()
