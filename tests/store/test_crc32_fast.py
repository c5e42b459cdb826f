"""``_speedups.crc32`` (CRC-32 by carry-less multiplication folding, zlib fallback) equals ``zlib.crc32``: every
length 0..300 at every start alignment 0..63, random lengths and initial values, large inputs, every buffer kind,
the same argument errors; both paths (folding and the forced zlib fallback) in one process; the folding constants
compiled into the extension equal the ones derived here from the polynomial; and put_batch / put_one write
BODYCRC = zlib.crc32(body) & 0x7FFFFFFF through it."""

from __future__ import annotations

import array
import mmap
import random
import re
import struct
import threading
import zlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ferrymq.common.message_codec import RecordCheck, check_record
from ferrymq.store import speedups
from support.native import require_extension

M32 = 0xFFFFFFFF
M64 = (1 << 64) - 1
#: the CRC-32 generator polynomial of zlib / gzip / IEEE 802.3: the exponents of its terms
POLY_EXPONENTS = (32, 26, 23, 22, 16, 12, 11, 10, 8, 7, 5, 4, 2, 1, 0)
HOST = b"\x7f\x00\x00\x01\x00\x00\x51\xaf"
BODY_CRC_MASK = 0x7FFFFFFF
INITIAL_VALUES = (0, M32, 1, 0x80000000, 0x12345678)


# --- the constants, derived from the polynomial ----------------------------------------------------------------
# Polynomials over GF(2) are ints here: bit d = the coefficient of x^d.


def poly() -> int:
    return sum(1 << e for e in POLY_EXPONENTS)


def poly_divmod(a: int, p: int) -> tuple[int, int]:
    """(quotient, remainder) of a / p."""
    q = 0
    dp = p.bit_length() - 1
    while a.bit_length() - 1 >= dp:
        shift = a.bit_length() - 1 - dp
        q |= 1 << shift
        a ^= p << shift
    return q, a


def reflect(v: int, width: int) -> int:
    """v with its low ``width`` bits in reverse order: the term x^d goes to bit width-1-d."""
    return int(format(v, f"0{width}b")[::-1], 2)


def x_pow_mod(e: int) -> int:
    return poly_divmod(1 << e, poly())[1]


def crc32_constants() -> tuple[int, ...]:
    """The constants in the order of ``_speedups._crc32_constants()`` / the table in ``_speedups.c``:
    x^575, x^511, x^191, x^127, x^95, x^63 mod P with x^d at bit 63-d ("N = 63": fold by 512 bits, fold by 128
    bits, 128 -> 96 -> 64 bits); then mu = floor(x^64 / P) and P itself with x^d at bit 32-d (N = 32, Barrett)."""
    folds = tuple(reflect(x_pow_mod(e), 64) for e in (575, 511, 191, 127, 95, 63))
    mu = poly_divmod(1 << 64, poly())[0]
    return (*folds, reflect(mu, 33), reflect(poly(), 33))


def clmul(a: int, b: int) -> int:
    """PCLMULQDQ: the carry-less product of two 64-bit values."""
    r = 0
    while b:
        if b & 1:
            r ^= a
        a <<= 1
        b >>= 1
    return r


def model_crc32(data: bytes, crc: int = 0) -> int:
    """The C folding path step by step (four 16-byte accumulators, 64 bytes per step; fold to one; Barrett), the
    tail and short inputs by zlib like the C code; the reference for the algorithm, independent of the C."""
    k575, k511, k191, k127, k95, k63, mu, p33 = crc32_constants()
    n = len(data)
    if n < 64:
        return zlib.crc32(data, crc)

    def block(i: int) -> int:
        return int.from_bytes(data[i : i + 16], "little")

    def fold(x: int, k_low: int, k_high: int, nxt: int) -> int:
        return clmul(x & M64, k_low) ^ clmul(x >> 64, k_high) ^ nxt

    acc = [block(0) ^ (crc ^ M32), block(16), block(32), block(48)]
    pos = 64
    while n - pos >= 64:
        acc = [fold(acc[j], k575, k511, block(pos + 16 * j)) for j in range(4)]
        pos += 64
    x = fold(acc[0], k191, k127, acc[1])
    x = fold(x, k191, k127, acc[2])
    x = fold(x, k191, k127, acc[3])
    while n - pos >= 16:
        x = fold(x, k191, k127, block(pos))
        pos += 16
    s = clmul(x & M64, k95) ^ ((x >> 64) << 32)
    assert s & M32 == 0
    t = ((clmul(s & M64, k63) ^ s) >> 64) & M64
    q = clmul(t & M32, mu) & M32
    r = t ^ clmul(q, p33)
    assert r & M32 == 0
    return zlib.crc32(data[pos:], ((r >> 32) & M32) ^ M32)


def test_derived_constants_are_the_known_ones() -> None:
    # the reflected polynomial every zlib-compatible CRC-32 uses, and the table's first entry
    assert reflect(poly(), 33) >> 1 == 0xEDB88320
    assert crc32_constants()[0] == 0x653D982200000000


def test_model_of_the_folding_equals_zlib() -> None:
    rng = random.Random(5)
    for n in [*range(60, 200), 255, 256, 257, 511, 1000, 1024, 2047]:
        data = rng.randbytes(n)
        for crc in (0, M32, rng.getrandbits(32)):
            assert model_crc32(data, crc) == zlib.crc32(data, crc), (n, crc)


# --- the extension ------------------------------------------------------------------------------------------------


@pytest.fixture
def ext() -> Any:
    return require_extension()


@pytest.fixture(params=["fold", "zlib"])
def crc_path(request: pytest.FixtureRequest, ext: Any) -> Iterator[str]:
    """Run the test with the folding path (skipped where the CPU lacks PCLMULQDQ / SSE4.1) and with the forced zlib
    fallback; the default (folding where available) is restored after."""
    try:
        if request.param == "fold":
            if not ext._crc32_force_fallback(False):
                pytest.skip("no PCLMULQDQ + SSE4.1 on this CPU (or not an x86-64 build)")
        else:
            assert ext._crc32_force_fallback(True) is False
        yield request.param
    finally:
        ext._crc32_force_fallback(False)


def test_constants_compiled_in_equal_the_derived_ones(ext: Any) -> None:
    assert ext._crc32_constants() == crc32_constants()


def test_every_short_length_at_every_alignment(ext: Any, crc_path: str) -> None:
    rng = random.Random(1)
    outer = rng.randbytes(64 + 300 + 64)
    view = memoryview(outer)
    crc32 = ext.crc32
    for n in range(301):
        for start in range(64):
            chunk = view[start : start + n]
            crc = INITIAL_VALUES[(n + start) % len(INITIAL_VALUES)]
            assert crc32(chunk, crc) == zlib.crc32(chunk, crc), (n, start, crc)
        assert crc32(view[:n]) == zlib.crc32(view[:n])


def test_random_lengths_and_values(ext: Any, crc_path: str) -> None:
    rng = random.Random(2)
    outer = rng.randbytes(4096 + 64)
    for _ in range(3000):
        n = rng.randrange(4097)
        start = rng.randrange(64)
        chunk = outer[start : start + n]
        crc = rng.choice([*INITIAL_VALUES, rng.getrandbits(32)])
        assert ext.crc32(chunk, crc) == zlib.crc32(chunk, crc), (n, start, crc)


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=4096), start=st.integers(0, 63), crc=st.integers(0, M32))
def test_hypothesis_equal_to_zlib(data: bytes, start: int, crc: int) -> None:
    ext = require_extension()
    padded = bytes(start) + data
    assert ext.crc32(memoryview(padded)[start:], crc) == zlib.crc32(data, crc)
    # continuing a running crc over a split gives the whole
    cut = len(data) // 3
    assert ext.crc32(data[cut:], ext.crc32(data[:cut], crc)) == zlib.crc32(data, crc)


def test_large_inputs(ext: Any, crc_path: str) -> None:
    rng = random.Random(3)
    one_mib = rng.randbytes(1 << 20)
    for start in (0, 1, 7, 15, 33):
        for end in (1 << 20, (1 << 20) - 1, (1 << 20) - 13):
            view = memoryview(one_mib)[start:end]
            assert ext.crc32(view, 0x5A5A5A5A) == zlib.crc32(view, 0x5A5A5A5A)
    if crc_path == "fold":  # once: the zlib path is zlib itself
        big = bytearray(rng.randbytes(1 << 20)) * 64  # 64 MiB
        big[12345] ^= 0xFF
        assert ext.crc32(big) == zlib.crc32(big)
        assert ext.crc32(memoryview(big)[3:]) == zlib.crc32(memoryview(big)[3:])


def test_buffer_kinds(ext: Any, crc_path: str) -> None:
    data = random.Random(4).randbytes(1000)
    kinds: list[Any] = [data, bytearray(data), memoryview(data), memoryview(data)[5:900], memoryview(bytearray(data))]
    kinds.append(array.array("i", data[:996]))  # itemsize 4: a C-contiguous buffer, read as its bytes
    kinds.append(memoryview(bytearray(data)).cast("B", (10, 100)))  # 2-D, C-contiguous
    mm = mmap.mmap(-1, len(data))
    mm[:] = data
    kinds.append(mm)
    try:
        for obj in kinds:
            for crc in INITIAL_VALUES:
                assert ext.crc32(obj, crc) == zlib.crc32(obj, crc), type(obj)
            assert ext.crc32(obj) == zlib.crc32(obj)
    finally:
        del kinds
        mm.close()


def _outcome(fn: Callable[..., int], *args: Any, **kwargs: Any) -> tuple[str, str]:
    try:
        return "ok", str(fn(*args, **kwargs))
    except Exception as exc:  # noqa: BLE001 - the exception is what is compared
        return type(exc).__name__, str(exc)


def _unqualified(outcome: tuple[str, str]) -> tuple[str, str]:
    """The outcome with "zlib.crc32()" / "ferrymq.store._speedups.crc32()" in a message read as "crc32()"."""
    return outcome[0], re.sub(r"[\w.]+\.crc32\(\)", "crc32()", outcome[1])


def test_argument_handling_like_zlib(ext: Any, crc_path: str) -> None:
    data = b"some bytes " * 10
    non_contiguous = memoryview(bytearray(data))[::2]
    cases: list[tuple[tuple[Any, ...], dict[str, Any]]] = [
        ((non_contiguous,), {}),
        ((non_contiguous, 5), {}),
        (("text",), {}),
        ((None,), {}),
        ((1.5,), {}),
        ((12,), {}),
        ((data, 1.5), {}),
        ((data, "1"), {}),
        ((data, None), {}),
        ((non_contiguous, "x"), {}),  # the buffer is checked first
        ((), {}),
        ((data, 0, 1), {}),
        ((data,), {"value": 1}),
        ((data, -1), {}),
        ((data, -(1 << 70) + 3), {}),
        ((data, (1 << 40) | 0xABCDEF), {}),
        ((data, True), {}),
        ((b"", 0xDEADBEEF), {}),
        ((bytearray(), -5), {}),
    ]
    for args, kwargs in cases:
        got = _outcome(ext.crc32, *args, **kwargs)
        want = _outcome(zlib.crc32, *args, **kwargs)
        assert _unqualified(got) == _unqualified(want), (args, kwargs)


def test_results_are_unsigned_ints(ext: Any, crc_path: str) -> None:
    for n in (0, 10, 100, 10000):
        value = ext.crc32(bytes(range(256)) * (n // 256) + bytes(n % 256), M32)
        assert type(value) is int and 0 <= value <= M32


def test_threads_with_the_gil_released(ext: Any, crc_path: str) -> None:
    """Inputs >= 64 KiB are checksummed without the GIL: several threads at once still get zlib's results."""
    rng = random.Random(6)
    inputs = [bytearray(rng.randbytes(rng.randrange(1 << 16, 1 << 18))) for _ in range(8)]
    want = [zlib.crc32(b) for b in inputs]
    errors: list[str] = []

    def work(i: int) -> None:
        for _ in range(20):
            if ext.crc32(inputs[i]) != want[i]:
                errors.append(f"input {i}")

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(inputs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_force_fallback_switch(ext: Any) -> None:
    try:
        available = ext._crc32_force_fallback(False)
        assert isinstance(available, bool)
        assert ext._crc32_force_fallback(True) is False
        data = bytes(range(256)) * 4
        assert ext.crc32(data) == zlib.crc32(data)
        assert ext._crc32_force_fallback(1) is False  # any truth value
        assert ext._crc32_force_fallback(0) is available
        assert ext._crc32_force_fallback(False) is available
        assert ext._crc32_force_fallback(False) is available
        assert ext.crc32(data) == zlib.crc32(data)
    finally:
        ext._crc32_force_fallback(False)


def test_the_speedups_crc32_name() -> None:
    fn = speedups.crc32
    if speedups.NATIVE is None:
        assert fn is zlib.crc32
    else:
        assert fn is speedups.NATIVE.crc32
    assert fn(b"123456789") == 0xCBF43926  # the CRC-32 check value


# --- BODYCRC written by put_batch / put_one ---------------------------------------------------------------------

BODY_LENGTHS = [0, 1, 15, 16, 63, 64, 65, 79, 80, 127, 128, 129, 1000, 1024, 4095, 70000]
_BATCH_ENTRY = struct.Struct(">iiiii")


def _batch_body(bodies: list[bytes]) -> bytes:
    out = bytearray()
    for body in bodies:
        out += _BATCH_ENTRY.pack(20 + len(body) + 2, 0, 0, 0, len(body)) + body + b"\x00\x00"
    return bytes(out)


def _check_written(mm: bytearray, offsets: list[int], bodies: list[bytes]) -> None:
    for phy, body in zip(offsets, bodies, strict=True):
        (crc,) = struct.unpack_from(">I", mm, phy + 8)
        (body_len,) = struct.unpack_from(">i", mm, phy + 84)
        assert body_len == len(body) and mm[phy + 88 : phy + 88 + body_len] == body
        assert crc == zlib.crc32(body) & BODY_CRC_MASK, len(body)
        status, _size = check_record(mm, phy, True, expected_phy_offset=phy)
        assert status is RecordCheck.OK


def test_put_batch_bodycrc(ext: Any, crc_path: str) -> None:
    rng = random.Random(7)
    bodies = [rng.randbytes(n) for n in BODY_LENGTHS] + [rng.randbytes(rng.randrange(2000)) for _ in range(20)]
    batch = _batch_body(bodies)
    mm = bytearray(len(batch) + 200 * len(bodies))
    res = ext.put_batch(mm, 0, len(mm), batch, b"TopicA", 0, 0, 0, b"", b"C", HOST, HOST, 0, lambda: 1, 0, 0, 32767,
                        1 << 22)
    assert res is not None
    count, _total, offsets, _ids, _ts = res
    assert count == len(bodies)
    _check_written(mm, offsets, bodies)


def test_put_one_bodycrc(ext: Any, crc_path: str) -> None:
    rng = random.Random(8)
    for n in BODY_LENGTHS + [rng.randrange(5000) for _ in range(10)] + [300_000]:  # 300 KB: the no-GIL write
        body = rng.randbytes(n)
        start = rng.randrange(64)
        view = memoryview(bytes(start) + body)[start:]  # bodies at any alignment
        mm = bytearray(n + 400)
        res = ext.put_one(mm, 0, len(mm), view, b"TAGS\x01t", b"TopicA", 0, 0, 0, b"C", HOST, HOST, 0, lambda: 1, 0, 0,
                          0, 32767, 1 << 22)
        assert res is not None and res[2] is not None
        _check_written(mm, [0], [body])
