"""Sans-IO remoting codec: round trips, chunking, the clients' header quirks, limits."""

from __future__ import annotations

import json
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ferrymq.errors import FrameTooLargeError, ProtocolError
from ferrymq.remoting.codec import (
    SERIALIZE_ROCKETMQ,
    FrameDecoder,
    RemotingCommand,
    decode_frame,
    encode,
)

text = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=30)
commands = st.builds(
    RemotingCommand,
    code=st.integers(min_value=0, max_value=32767),
    ext_fields=st.dictionaries(text.filter(bool), text, max_size=6),
    body=st.binary(max_size=300),
    opaque=st.integers(min_value=0, max_value=2**31 - 1),
    flag=st.integers(min_value=0, max_value=3),
    remark=st.one_of(st.none(), text.filter(bool)),
    language=st.sampled_from(["JAVA", "CPP", "PYTHON"]),
    version=st.integers(min_value=0, max_value=32767),
    serialize_type=st.sampled_from([0, 1]),
)


@given(commands)
def test_round_trip(cmd: RemotingCommand) -> None:
    assert FrameDecoder().feed(encode(cmd)) == [cmd]


@given(st.lists(commands, min_size=1, max_size=5), st.data())
def test_arbitrary_chunking(cmds: list[RemotingCommand], data: st.DataObject) -> None:
    wire = b"".join(encode(c) for c in cmds)
    decoder, out = _feed_in_pieces(wire, sorted(data.draw(st.lists(st.integers(0, len(wire)), max_size=8))))
    assert out == cmds
    assert decoder.buffered == 0


def _feed_in_pieces(wire: bytes, cuts: list[int]) -> tuple[FrameDecoder, list[RemotingCommand]]:
    """A fresh decoder fed ``wire`` cut at the (sorted) ``cuts``; returns it and every command it gave."""
    decoder = FrameDecoder()
    out: list[RemotingCommand] = []
    prev = 0
    for cut in [*cuts, len(wire)]:
        out += decoder.feed(wire[prev:cut])
        prev = cut
    return decoder, out


def _frame(header: bytes, body: bytes = b"", stype: int = 0) -> bytes:
    return struct.pack(">iI", 4 + len(header) + len(body), (stype << 24) | len(header)) + header + body


def test_cpp_header_with_trailing_newline_and_numeric_fields() -> None:
    header = (
        b'{"code":10,"extFields":{"batch":"0","queueId":0,"flag":0,"unitMode":"0","k":false},'
        b'"flag":0,"language":"CPP","opaque":1,"remark":"","version":63}\n'
    )
    [cmd] = FrameDecoder().feed(_frame(header, b"hello"))
    assert cmd.code == 10 and cmd.language == "CPP" and cmd.version == 63
    assert cmd.ext_fields == {"batch": "0", "queueId": "0", "flag": "0", "unitMode": "0", "k": "false"}
    assert cmd.get_int("queueId") == 0 and cmd.get_bool("k") is False and cmd.body == b"hello"


def test_response_values_are_strings_and_high_byte_zero() -> None:
    req = RemotingCommand.request(10, {"a": 1})
    req.opaque = 9
    resp = req.response(0, {"queueOffset": 7, "flag": True})
    wire = encode(resp)
    (word,) = struct.unpack_from(">I", wire, 4)
    assert word >> 24 == 0
    header = json.loads(wire[8 : 8 + (word & 0xFFFFFF)])
    assert header["extFields"] == {"queueOffset": "7", "flag": "true"}
    assert header["opaque"] == 9 and header["flag"] == 1


def test_binary_request_is_answered_in_binary() -> None:
    req = RemotingCommand(code=34, serialize_type=SERIALIZE_ROCKETMQ, opaque=3)
    assert req.response(0).serialize_type == SERIALIZE_ROCKETMQ


def test_oversized_length_refused_before_body_arrives() -> None:
    decoder = FrameDecoder(max_frame_bytes=1024)
    with pytest.raises(FrameTooLargeError):
        decoder.feed(struct.pack(">i", 2**31 - 1))


@pytest.mark.parametrize(
    "wire",
    [
        struct.pack(">i", 2),  # shorter than the header-length word
        _frame(b"not json"),
        _frame(b"[1,2]"),
        struct.pack(">iI", 8, 100) + b"abcd",  # header length beyond frame
        _frame(b"\x00\x01", stype=1),  # truncated binary header
        _frame(b"{}", stype=7),  # unknown serialize type
    ],
)
def test_malformed_frames_raise_protocol_error(wire: bytes) -> None:
    with pytest.raises(ProtocolError):
        FrameDecoder().feed(wire)


def test_non_integer_header_field_is_a_protocol_error() -> None:
    cmd = RemotingCommand(code=11, ext_fields={"queueId": "abc"})
    with pytest.raises(ProtocolError):
        cmd.get_int("queueId")


def test_decode_frame_without_prefix() -> None:
    cmd = RemotingCommand.request(105, {"topic": "T"})
    assert decode_frame(encode(cmd)[4:]) == cmd


big_bodies = st.one_of(st.binary(max_size=64), st.integers(8 * 1024, 300 * 1024).map(lambda n: bytes(range(256)) * (n // 256) + b"x" * (n % 256)))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 400), big_bodies, st.booleans()), min_size=1, max_size=5), st.data())
def test_large_frames_over_many_reads(specs: list[tuple[int, bytes, bool]], data: st.DataObject) -> None:
    """Frames of up to ~300 KiB (JSON, some binary-header) cut into reads anywhere — inside the prefix, the
    header, the body, between frames, several frames per read — decode to the same commands; the large-frame
    path (chunks kept, body joined once) and the buffered path answer alike, and nothing stays buffered."""
    cmds = [RemotingCommand(code=code, ext_fields={"k": str(i)}, body=body, opaque=i,
                            serialize_type=SERIALIZE_ROCKETMQ if binary else 0)
            for i, (code, body, binary) in enumerate(specs)]
    wire = b"".join(encode(c) for c in cmds)
    decoder, out = _feed_in_pieces(wire, sorted(data.draw(st.lists(st.integers(0, len(wire)), max_size=12))))
    assert [(c.code, c.opaque, c.ext_fields, c.body) for c in out] == [
        (c.code, c.opaque, c.ext_fields, c.body) for c in cmds]
    assert all(type(c.body) is bytes for c in out)
    assert decoder.buffered == 0


def test_large_frame_in_pieces_is_held_as_chunks_and_counted_as_buffered() -> None:
    body = bytes(range(256)) * 1024  # 256 KiB
    wire = encode(RemotingCommand(code=320, ext_fields={"b": "T"}, body=body, opaque=7))
    decoder = FrameDecoder()
    assert decoder.feed(wire[:100_000]) == []
    assert decoder.buffered == 100_000
    assert decoder.feed(wire[100_000:200_000]) == []
    assert decoder.buffered == 200_000
    # the rest plus the first bytes of a next frame
    nxt = encode(RemotingCommand(code=11, opaque=8))
    out = decoder.feed(wire[200_000:] + nxt[:5])
    assert [(c.opaque, c.body) for c in out] == [(7, body)]
    assert decoder.buffered == 5
    assert [c.opaque for c in decoder.feed(nxt[5:])] == [8]
    assert decoder.buffered == 0


def test_oversized_length_refused_while_a_large_frame_is_pending() -> None:
    body = b"z" * 40_000
    wire = encode(RemotingCommand(code=320, body=body, opaque=1))
    decoder = FrameDecoder(max_frame_bytes=1 << 20)
    assert decoder.feed(wire[:10_000]) == []
    with pytest.raises(FrameTooLargeError):
        decoder.feed(wire[10_000:] + struct.pack(">i", (1 << 20) + 1))


@pytest.mark.parametrize("opaque", [b"99999999999999999999999", b"18446744073709551615", b"2147483648",
                                    b"-2147483649", b"1e30"])
def test_opaque_outside_the_int_range_is_a_protocol_error(opaque: bytes) -> None:
    """The opaque is a Java int echoed in the answer: a larger one is refused at the header parse (the
    connection is closed with one log line), never a TypeError from encoding the answer."""
    header = b'{"code":10,"language":"JAVA","version":400,"opaque":' + opaque + b',"flag":0,"extFields":{}}'
    frame = struct.pack(">ii", 4 + len(header), len(header)) + header
    with pytest.raises(ProtocolError, match="opaque"):
        FrameDecoder().feed(frame)


def test_opaque_int_range_edges_accepted() -> None:
    for opaque in (2**31 - 1, -(2**31)):
        header = b'{"code":10,"language":"JAVA","version":400,"opaque":%d,"flag":0,"extFields":{}}' % opaque
        (cmd,) = FrameDecoder().feed(struct.pack(">ii", 4 + len(header), len(header)) + header)
        assert cmd.opaque == opaque
