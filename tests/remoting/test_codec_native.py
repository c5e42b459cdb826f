"""The remoting C extension (``ferrymq.remoting._codec``) against its Python reference: frame decoding, the
SEND_OK answer and the V2 SEND header give the same results, or the extension declines and Python decides."""

from __future__ import annotations

import gc
import struct
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ferrymq.broker import headers
from ferrymq.broker.headers import SendHeader
from ferrymq.errors import ProtocolError
from ferrymq.remoting import codec
from ferrymq.remoting.codec import FrameDecoder, RemotingCommand, encode, encode_send_ok_response_py
from ferrymq.remoting.codes import RequestCode
from support.native import require_built

ext = codec.EXTENSION


@pytest.fixture(autouse=True)
def _built() -> None:
    require_built(ext, "ferrymq.remoting._codec")  # fails under CI=true when missing, skips elsewhere
    assert ext is not None
    # what broker/headers.py does when the extension is in use (not under FERRYMQ_PURE_PYTHON=1)
    ext.set_class("send_header", SendHeader, tuple(f.name for f in fields(SendHeader)))

_SEND_V2 = int(RequestCode.SEND_MESSAGE_V2)
_SEND_BATCH = int(RequestCode.SEND_BATCH_MESSAGE)

text = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=20)
json_scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**40), 2**40),
                         st.floats(allow_nan=False, allow_infinity=False), text)


def _feed_all(chunks: list[bytes], native: bool) -> list[Any]:
    """What a decoder returns for the chunks in turn: its commands, and the exception type that ended it."""
    assert ext is not None
    saved = codec._native_decode_frames
    codec._native_decode_frames = ext.decode_frames if native else None
    try:
        dec = FrameDecoder(max_frame_bytes=64 * 1024)
        out: list[Any] = []
        try:
            for chunk in chunks:
                out.extend(_fields_of(cmd) for cmd in dec.feed(chunk))
        except ProtocolError as exc:  # FrameTooLargeError included
            out.append(type(exc))
        out.append(dec.buffered)
        return out
    finally:
        codec._native_decode_frames = saved


def _fields_of(cmd: RemotingCommand) -> tuple[Any, ...]:
    """Every field with its exact type (``==`` alone takes True for 1)."""
    return tuple((type(getattr(cmd, f.name)), getattr(cmd, f.name)) for f in fields(RemotingCommand))


def _frame(header: bytes, body: bytes, stype: int = 0) -> bytes:
    return struct.pack(">iI", 4 + len(header) + len(body), (stype << 24) | len(header)) + header + body


headers_st = st.one_of(
    # the usual header, and near misses of each of its checks
    st.fixed_dictionaries(
        {"code": st.one_of(st.integers(0, 400), st.booleans(), st.just("10")),
         "opaque": st.one_of(st.integers(-(2**31), 2**31 - 1), st.integers(2**31, 2**33), st.just(-(2**31) - 1)),
         "flag": st.integers(0, 3), "version": st.one_of(st.integers(0, 500), st.floats(0, 5)),
         "language": st.one_of(st.sampled_from(["JAVA", "PYTHON"]), st.integers(0, 12)),
         "extFields": st.one_of(st.dictionaries(text, text, max_size=5),
                                st.dictionaries(text, json_scalars, max_size=3), st.none(), st.just([])),
         "serializeTypeCurrentRPC": st.just("JSON")},
        optional={"remark": st.one_of(text, st.none(), st.integers(-(2**40), 2**40))}),
    st.dictionaries(st.sampled_from(["code", "opaque", "flag", "version", "language", "extFields", "remark"]),
                    st.one_of(json_scalars, st.dictionaries(text, text, max_size=3)), max_size=7),
)


@given(frames=st.lists(st.tuples(headers_st, st.binary(max_size=40),
                                 st.sampled_from(["ok", "ok", "ok", "binary", "notjson", "hlen", "len"])),
                       min_size=1, max_size=5),
       cuts=st.lists(st.integers(0, 2000), max_size=4))
@settings(max_examples=200, deadline=None)
def test_decode_frames_equals_python(frames: list[tuple[dict[str, Any], bytes, str]], cuts: list[int]) -> None:
    raw = b""
    for obj, body, kind in frames:
        header = orjson.dumps(obj)
        if kind == "binary":
            raw += encode(RemotingCommand(code=10, ext_fields={"k": "v"}, body=body, serialize_type=1))
        elif kind == "notjson":
            raw += _frame(header[:-1], body)
        elif kind == "hlen":
            raw += struct.pack(">iI", 4 + len(header) + len(body), len(header) + len(body) + 1) + header + body
        elif kind == "len":
            raw += struct.pack(">i", 2) + header
        else:
            raw += _frame(header, body)
    # the same bytes whole, and cut into reads at the given points
    points = sorted({c % (len(raw) + 1) for c in cuts})
    chunks = [raw[a:b] for a, b in zip([0, *points], [*points, len(raw)], strict=True)]
    for parts in ([raw], chunks):
        assert _feed_all(parts, True) == _feed_all(parts, False)


def test_decode_frames_takes_the_usual_frames_and_stops_at_others() -> None:
    assert ext is not None
    usual = encode(RemotingCommand.request(310, {"b": "T", "e": "1"}, body=b"x" * 100))
    binary = encode(RemotingCommand(code=10, ext_fields={"k": "v"}, serialize_type=1))
    data = usual + usual + binary + usual
    cmds, pos = ext.decode_frames(data, 0, codec.MAX_FRAME_BYTES, codec.MAX_HEADER_BYTES)
    assert pos == 2 * len(usual) and len(cmds) == 2
    assert cmds[0] == codec.decode_frame(usual[4:])
    cmds, pos = ext.decode_frames(bytearray(data), pos + len(binary), codec.MAX_FRAME_BYTES, codec.MAX_HEADER_BYTES)
    assert pos == len(data) and len(cmds) == 1
    cmds, pos = ext.decode_frames(usual[:-1], 0, codec.MAX_FRAME_BYTES, codec.MAX_HEADER_BYTES)
    assert (cmds, pos) == ([], 0)
    with pytest.raises(ValueError):
        ext.decode_frames(usual, len(usual) + 1, codec.MAX_FRAME_BYTES, codec.MAX_HEADER_BYTES)


def test_the_decoder_uses_the_extension_unless_pure_python_is_asked() -> None:
    assert codec.NATIVE in (None, ext)
    if codec.NATIVE is not None:
        assert codec._native_decode_frames is not None and codec._native_send_ok is not None
        assert codec._native_encode is not None and headers._native_v2 is not None


@given(st.integers(-(2**70), 2**70), st.one_of(st.text(max_size=40), st.sampled_from(
           ["7F00000100002A9F0000000000000000", "AC11000100002A9F00000000000003E8", "a", "0" * 128, "0" * 129])),
       st.one_of(st.integers(-5, 2**31), st.integers(-(2**64), 2**64)),
       st.one_of(st.integers(0, 2**63 - 1), st.integers(-(2**70), 2**70)))
@settings(max_examples=300)
def test_encode_send_ok_equals_python(opaque: int, msg_id: str, queue_id: int, queue_offset: int) -> None:
    assert ext is not None
    frame = ext.encode_send_ok(opaque, msg_id, queue_id, queue_offset)
    try:
        reference = encode_send_ok_response_py(opaque, msg_id, queue_id, queue_offset)
    except TypeError:  # orjson: an opaque beyond 64 bits; the extension leaves it to the same error
        assert frame is None
        return
    if frame is not None:
        assert frame == reference
    elif msg_id.isascii() and msg_id.isalnum() and 0 < len(msg_id) <= 128 and \
            max(abs(opaque), abs(queue_id), abs(queue_offset)) < 2**63:
        pytest.fail("the extension declined a usual SEND_OK answer")


def test_encode_send_ok_declines_other_types() -> None:
    assert ext is not None
    assert ext.encode_send_ok(True, "AB", 1, 2) is None
    assert ext.encode_send_ok(1, b"AB", 1, 2) is None
    assert ext.encode_send_ok(1, "AB", 1.0, 2) is None
    with pytest.raises(TypeError):
        ext.encode_send_ok(1, "AB", 1)


int_text = st.one_of(
    st.integers(-(2**31), 2**31 - 1).map(str), st.integers(-(2**63), 2**63 - 1).map(str),
    st.integers(-(2**70), 2**70).map(str),
    st.sampled_from(["", "-", "+5", " 7", "7 ", "1_0", "٣", "0x10", "1.5", "1e3", "007", "-0", "999999999",
                     "1000000000", "-99999999", "-999999999", "999999999999999999", "-99999999999999999"]),
    text)
flag_text = st.sampled_from(["true", "false", "True", "FALSE", "1", "0", "", " true", "yes"])


@given(st.fixed_dictionaries(
    {"b": st.one_of(st.sampled_from(["TopicA", "%RETRY%g"]), text)},
    optional={"a": text, "c": st.one_of(st.just(""), text), "d": int_text, "e": int_text, "f": int_text,
              "g": int_text, "h": int_text, "i": text, "j": int_text, "k": flag_text, "l": int_text,
              "m": flag_text, "n": text, "topic": text}),
    st.sampled_from([_SEND_V2, _SEND_BATCH]))
@settings(max_examples=400)
def test_send_header_v2_equals_python(f: dict[str, str], code: int) -> None:
    assert ext is not None
    native = ext.send_header_v2(f, code == _SEND_BATCH)
    if native is None:
        return
    assert type(native) is SendHeader
    reference = SendHeader._parse_v2(f, code)
    assert reference is not None
    assert [(type(getattr(native, x.name)), getattr(native, x.name)) for x in fields(SendHeader)] == \
           [(type(getattr(reference, x.name)), getattr(reference, x.name)) for x in fields(SendHeader)]
    assert "topic" not in f


def test_send_header_v2_takes_the_usual_header() -> None:
    assert ext is not None
    f = {"a": "pg", "b": "TopicA", "c": "TBW102", "d": "4", "e": "3", "f": "0", "g": "1795756210065", "h": "0",
         "i": "WAIT\x01true\x02TAGS\x01TagA", "j": "0", "k": "false", "n": "broker-a"}
    h = ext.send_header_v2(f, False)
    assert h == SendHeader._parse_v2(f, _SEND_V2)
    assert ext.send_header_v2({**f, "m": "true"}, False).batch is True
    assert ext.send_header_v2({**f, "l": "16"}, True).max_reconsume_times == 16
    assert ext.send_header_v2({**f, "e": "-1", "c": ""}, False).default_topic == "TBW102"
    assert ext.send_header_v2({**f, "topic": "T"}, False) is None
    assert ext.send_header_v2({**f, "b": ""}, False) is None
    if headers._native_v2 is not None:
        cmd = RemotingCommand(code=_SEND_V2, ext_fields=f)
        assert SendHeader.parse(cmd) == h


def test_set_class_refuses_what_it_cannot_fill() -> None:
    assert ext is not None

    class Plain:
        pass

    @dataclass(slots=True)
    class Few:
        x: int

    with pytest.raises(TypeError):
        ext.set_class("command", Plain, tuple(f.name for f in fields(RemotingCommand)))
    with pytest.raises(ValueError):
        ext.set_class("command", Few, ("x",))
    with pytest.raises(ValueError):
        ext.set_class("other", Few, ("x",))


def _growth(fn: Callable[[], Any], rounds: int = 20_000) -> int:
    for _ in range(1000):
        fn()
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(rounds):
            fn()
        gc.collect()
        return tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()


def test_no_references_leak() -> None:
    assert ext is not None
    usual = encode(RemotingCommand.request(310, {"b": "T", "e": "1"}, body=b"x" * 100))
    declined = _frame(b'{"code":1,"extFields":{"a":1}}', b"")
    f = {"b": "TopicA", "e": "3", "l": "2", "g": "17"}
    for fn in (lambda: ext.decode_frames(usual + declined, 0, codec.MAX_FRAME_BYTES, codec.MAX_HEADER_BYTES),
               lambda: ext.decode_frames(b"\x00\x00\x00\x0a\x00\x00\x00\x02{]xxxx", 0, 100, 100),
               lambda: ext.encode_send_ok(7, "AB12", 3, 99),
               lambda: ext.send_header_v2(f, True),
               lambda: ext.send_header_v2({**f, "k": "maybe"}, False),
               lambda: ext.encode_json(RemotingCommand(310, {"b": "T\x01\u00e9", "e": "1"}, b"x", 7, remark="r")),
               lambda: ext.encode_json(RemotingCommand(310, {"b": "\ud800"}))):
        assert _growth(fn) < 64 * 1024


any_text = st.text(max_size=30)  # surrogates included: orjson refuses them, the extension declines them
wire_ints = st.one_of(st.integers(-(2**31), 2**31 - 1), st.integers(-(2**64), 2**65))


@given(code=wire_ints, opaque=wire_ints, flag=st.integers(0, 3), version=wire_ints, language=any_text,
       ext_fields=st.one_of(st.dictionaries(any_text, any_text, max_size=6),
                            st.dictionaries(text, json_scalars, max_size=3)),
       remark=st.one_of(st.none(), any_text), body=st.binary(max_size=64),
       serialize_type=st.sampled_from([0, 0, 0, 1]))
@settings(max_examples=300)
def test_encode_json_equals_python(code: int, opaque: int, flag: int, version: int, language: str,
                                   ext_fields: dict[str, Any], remark: str | None, body: bytes,
                                   serialize_type: int) -> None:
    assert ext is not None
    cmd = RemotingCommand(code, ext_fields, body, opaque, flag, remark, language, version, serialize_type)
    frame = ext.encode_json(cmd)
    try:
        reference: bytes | type[Exception] = codec.encode_py(cmd)
    except Exception as exc:  # noqa: BLE001 - whatever the reference raises, the extension must decline
        reference = type(exc)
    if frame is None:
        usual = (serialize_type == 0 and all(type(v) is str for v in ext_fields.values())
                 and max(abs(code), abs(opaque), abs(version)) < 2**63 and isinstance(reference, bytes))
        assert not usual, "the extension declined a usual command"
        return
    assert frame == reference
    assert codec.encode(cmd) == frame


def test_encode_json_declines_other_shapes() -> None:
    assert ext is not None
    cmd = RemotingCommand(10, {"a": "b"}, b"x")
    assert ext.encode_json(cmd) == codec.encode_py(cmd)
    every = "".join(map(chr, range(128))) + "\u00e9\u20ac\U0001f600\u2028"
    cmd = RemotingCommand(-5, {every: every, "i": "WAIT\x01true\x02"}, b"", -(2**63), 3, every, every, 2**63 - 1)
    assert ext.encode_json(cmd) == codec.encode_py(cmd)
    assert ext.encode_json(RemotingCommand(10, {"a": 1})) is None  # type: ignore[dict-item]
    assert ext.encode_json(RemotingCommand(10, {"a": "b"}, bytearray(b"x"))) is None  # type: ignore[arg-type]
    assert ext.encode_json(RemotingCommand(True, {"a": "b"})) is None
    assert ext.encode_json(RemotingCommand(10, serialize_type=1)) is None
    assert ext.encode_json(RemotingCommand(10, {"a": "\ud800"})) is None
    assert ext.encode_json(object()) is None
    big = RemotingCommand(10, {str(i): "v" for i in range(300)})
    assert ext.encode_json(big) is None and codec.encode(big) == codec.encode_py(big)
