"""The remoting C extension on hostile bytes: valid frames with bytes flipped, cut, or replaced by random ones
decode exactly as the Python reference decodes them (the same commands, the same error, the same bytes left
buffered), and never crash the process. A peer controls every byte the extension reads."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_codec_native import _feed_all

from ferrymq.remoting import codec
from ferrymq.remoting.codec import RemotingCommand, encode
from support.native import require_built


@pytest.fixture(autouse=True)
def _built() -> None:
    require_built(codec.EXTENSION, "ferrymq.remoting._codec")


def _valid_stream(rng: random.Random) -> bytes:
    out = b""
    for _ in range(rng.randint(1, 4)):
        fields = {f"k{i}": "v" * rng.randint(0, 30) for i in range(rng.randint(0, 6))}
        cmd = RemotingCommand.request(rng.choice([10, 11, 310, 320, 34]), fields,
                                      body=rng.randbytes(rng.randint(0, 64)))
        cmd.remark = rng.choice([None, "", "r" * rng.randint(1, 10)])
        out += encode(cmd)
    return out


@given(seed=st.integers(0, 2**32 - 1), flips=st.integers(1, 12), cuts=st.lists(st.integers(0, 4000), max_size=3))
@settings(max_examples=600, deadline=None)
def test_flipped_bytes_decode_as_the_reference_decodes_them(seed: int, flips: int, cuts: list[int]) -> None:
    rng = random.Random(seed)
    raw = bytearray(_valid_stream(rng))
    for _ in range(flips):
        i = rng.randrange(len(raw))
        mode = rng.randrange(4)
        if mode == 0:
            raw[i] ^= 1 << rng.randrange(8)
        elif mode == 1:
            raw[i] = rng.choice(b'{}[]":,\\0-9eE.\x00\xff nultrf')
        elif mode == 2:
            del raw[i:i + rng.randint(1, 8)]
        else:
            raw[i:i] = rng.randbytes(rng.randint(1, 8))
        if not raw:
            raw = bytearray(b"\x00")
    data = bytes(raw)
    points = sorted({c % (len(data) + 1) for c in cuts})
    chunks = [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]
    for parts in ([data], chunks):
        assert _feed_all(parts, True) == _feed_all(parts, False)


@given(data=st.binary(min_size=1, max_size=300))
@settings(max_examples=600, deadline=None)
def test_random_bytes_decode_as_the_reference_decodes_them(data: bytes) -> None:
    assert _feed_all([data], True) == _feed_all([data], False)


json_noise = st.text(alphabet='{}[]":,\\/0123456789-+.eEtruefalsncodepqgxFV \t\n\x00\u00e9\U0001f600', max_size=120)


@given(header=st.one_of(json_noise, st.builds(lambda a, b: '{"code":' + a + ',"extFields":{' + b, json_noise,
                                              json_noise)),
       body=st.binary(max_size=40), hlen_delta=st.integers(-3, 3))
@settings(max_examples=600, deadline=None)
def test_framed_json_noise_decodes_as_the_reference_decodes_it(header: str, body: bytes, hlen_delta: int) -> None:
    """Lengths right (or nearly), the header any JSON-like text: what reaches the extension's field checks."""
    raw_header = header.encode("utf-8", "surrogatepass")
    hlen = max(0, len(raw_header) + hlen_delta)
    frame = (4 + len(raw_header) + len(body)).to_bytes(4, "big") + hlen.to_bytes(4, "big") + raw_header + body
    assert _feed_all([frame], True) == _feed_all([frame], False)
