"""Fast paths of the codec and the connection (round 3): equal to the general paths they bypass."""

from __future__ import annotations

import asyncio
import struct
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ferrymq.errors import FrameTooLargeError, ProtocolError
from ferrymq.remoting import codec
from ferrymq.remoting.codec import (
    FLAG_ONEWAY,
    FLAG_RESPONSE,
    SERIALIZE_JSON,
    SERIALIZE_ROCKETMQ,
    FrameDecoder,
    RemotingCommand,
    decode_json_header,
    encode,
    encode_send_ok_response,
)
from ferrymq.remoting.codes import CURRENT_VERSION
from ferrymq.remoting.connection import Connection, Dispatcher
from support.transports import StubTransport

text = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=20)
json_scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**40), 2**40), st.floats(allow_nan=False,
                         allow_infinity=False), text)
field_values = st.one_of(json_scalars, st.integers(0, 5000))


@given(
    st.dictionaries(st.sampled_from(["code", "opaque", "flag", "version", "language", "extFields", "remark",
                                     "serializeTypeCurrentRPC"]),
                    st.one_of(field_values, st.dictionaries(text, json_scalars, max_size=4),
                              st.dictionaries(text, text, max_size=4)), max_size=8),
    st.binary(max_size=8),
)
def test_json_header_fast_path_equals_general(obj: dict[str, Any], body: bytes) -> None:
    raw = orjson.dumps(obj)
    try:
        expected: RemotingCommand | type[ProtocolError] = codec._decode_json_header_general(orjson.loads(raw), body)
    except ProtocolError:
        expected = ProtocolError
    if expected is ProtocolError:
        with pytest.raises(ProtocolError):
            decode_json_header(raw, body)
    else:
        assert decode_json_header(raw, body) == expected


@given(st.fixed_dictionaries(
    {"code": st.integers(0, 400), "opaque": st.integers(0, 2**31 - 1), "flag": st.integers(0, 3),
     "version": st.integers(0, 500), "language": st.sampled_from(["JAVA", "CPP", 3]),
     "extFields": st.one_of(st.dictionaries(text, text, max_size=5), st.dictionaries(text, json_scalars, max_size=5),
                            st.none())},
    optional={"remark": st.one_of(st.none(), text, st.integers(-(2**63), 2**63 - 1)), "serializeTypeCurrentRPC": st.just("JSON")}))
def test_well_formed_json_headers_fast_path_equals_general(obj: dict[str, Any]) -> None:
    raw = orjson.dumps(obj)
    assert decode_json_header(raw, b"b") == codec._decode_json_header_general(orjson.loads(raw), b"b")


@pytest.mark.parametrize("raw", [b"[1, 2]", b"3", b'"x"', b"null", b"{", b'{"code": 1, "extFields": [1]}'])
def test_json_header_non_objects_refused(raw: bytes) -> None:
    with pytest.raises(ProtocolError):
        decode_json_header(raw, b"")


def _frame(cmd: RemotingCommand) -> bytes:
    return encode(cmd)


@given(st.lists(st.builds(RemotingCommand, code=st.integers(0, 400), ext_fields=st.dictionaries(text, text, max_size=4),
                          body=st.binary(max_size=64), opaque=st.integers(0, 2**31 - 1),
                          serialize_type=st.sampled_from([SERIALIZE_JSON, SERIALIZE_ROCKETMQ])),
                min_size=1, max_size=4))
def test_single_frame_reads_decode_like_chunked(cmds: list[RemotingCommand]) -> None:
    dec = FrameDecoder()
    for cmd in cmds:  # one whole frame per read: the fast path for JSON frames
        assert dec.feed(_frame(cmd)) == [cmd]
    assert dec.buffered == 0
    wire = b"".join(map(_frame, cmds))
    dec2 = FrameDecoder()
    out = [c for i in range(0, len(wire), 5) for c in dec2.feed(wire[i:i + 5])]
    assert out == cmds


def test_single_frame_fast_path_keeps_limits() -> None:
    frame = _frame(RemotingCommand(310, {"a": "b"}, b"x" * 100))
    with pytest.raises(FrameTooLargeError):
        FrameDecoder(max_frame_bytes=64).feed(frame)
    bad_hlen = frame[:4] + struct.pack(">I", len(frame)) + frame[8:]  # header longer than the frame
    with pytest.raises(ProtocolError):
        FrameDecoder().feed(bad_hlen)
    with pytest.raises(ProtocolError):
        FrameDecoder().feed(struct.pack(">iI", 4, 9 << 24))  # unknown serialize type


@given(st.integers(-(2**31), 2**31 - 1), st.one_of(st.text(max_size=40), st.sampled_from(["7F0000010000A1B2"])),
       st.integers(-(2**40), 2**40), st.integers(-(2**70), 2**70), st.sampled_from([SERIALIZE_JSON, SERIALIZE_ROCKETMQ]))
def test_send_ok_template_equals_generic_encode(opaque: int, msg_id: str, queue_id: int, offset: int,
                                                stype: int) -> None:
    cmd = RemotingCommand(0, {"msgId": msg_id, "queueId": str(queue_id), "queueOffset": str(offset),
                              "MSG_REGION": "DefaultRegion", "TRACE_ON": "true"},
                          b"", opaque, FLAG_RESPONSE, None, "JAVA", CURRENT_VERSION, stype)
    assert encode_send_ok_response(opaque, msg_id, queue_id, offset, stype) == encode(cmd)


def test_send_ok_template_typical() -> None:
    frame = encode_send_ok_response(77, "7F00000100002A9F0000000000001234", 3, 123456)
    [cmd] = FrameDecoder().feed(frame)
    assert cmd.ext_fields == {"msgId": "7F00000100002A9F0000000000001234", "queueId": "3", "queueOffset": "123456",
                              "MSG_REGION": "DefaultRegion", "TRACE_ON": "true"}
    assert (cmd.code, cmd.opaque, cmd.flag, cmd.language, cmd.version) == (0, 77, 1, "JAVA", CURRENT_VERSION)


class _Transport(StubTransport):
    def __init__(self) -> None:
        self.out: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.out.append(data)


async def test_handlers_may_answer_with_encoded_frames() -> None:
    disp = Dispatcher()
    disp.register(1, lambda conn, cmd: encode_send_ok_response(cmd.opaque, "AB12", 1, 2))
    disp.register(2, lambda conn, cmd: cmd.response(0, {"x": 1}))

    async def later(cmd: RemotingCommand) -> bytes:
        await asyncio.sleep(0)
        return encode_send_ok_response(cmd.opaque, "CD34", 5, 6)

    disp.register(3, lambda conn, cmd: later(cmd))
    conn = Connection(disp)
    tr = _Transport()
    conn.connection_made(tr)  # type: ignore[arg-type]
    reqs = [RemotingCommand(1, opaque=10), RemotingCommand(2, opaque=11), RemotingCommand(3, opaque=12),
            RemotingCommand(1, opaque=13, flag=FLAG_ONEWAY), RemotingCommand(2, opaque=14, flag=FLAG_ONEWAY)]
    for req in reqs:
        conn.data_received(encode(req))
    await asyncio.sleep(0.01)
    answers = [c for data in tr.out for c in FrameDecoder().feed(data)]
    assert [(a.opaque, a.ext_fields.get("msgId")) for a in answers] == [(10, "AB12"), (11, None), (12, "CD34")]
    assert tr.out[0] == encode_send_ok_response(10, "AB12", 1, 2)
    conn.close()
    conn.data_received(encode(RemotingCommand(1, opaque=20)))  # closed: no answer
    assert len(tr.out) == 3
