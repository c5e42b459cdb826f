"""Sans-IO codec of the RocketMQ remoting frame (protocol §1). Bytes in, commands out; no sockets.

Frame layout (all integers big-endian):

| offset | size | field              | notes                                                        |
|--------|------|--------------------|--------------------------------------------------------------|
| 0      | 4    | length (int32)     | bytes after this field: 4 + header length + body length      |
| 4      | 4    | headerLenAndType   | high byte: 0 = JSON, 1 = ROCKETMQ binary; low 24 bits: length |
| 8      | H    | header             | JSON object (§1.2) or binary header (§1.4)                   |
| 8+H    | rest | body               | opaque bytes                                                 |

JSON header keys: ``code`` int, ``language`` str, ``version`` int, ``opaque`` int, ``flag`` int
(bit 0 = response, bit 1 = oneway), ``remark`` str|null, ``extFields`` {str: str}.

ROCKETMQ binary header (§1.4):

| size  | field                                                                 |
|-------|-----------------------------------------------------------------------|
| 2     | code (int16)                                                          |
| 1     | language code                                                         |
| 2     | version (int16)                                                       |
| 4     | opaque (int32)                                                        |
| 4     | flag (int32)                                                          |
| 4 + n | remark: int32 length + UTF-8                                          |
| 4 + m | extFields: int32 total length + entries [int16 kLen][k][int32 vLen][v]|

We always answer JSON with a zero high byte (the C++ client and ali-ons do not mask it), unless the
request came in binary.

The optional C extension ``ferrymq.remoting._codec`` (its table at the top of ``_codec.c``) decodes whole JSON
frames with the usual header (``FrameDecoder.feed``), writes JSON frames (``encode``) and the SEND_OK answer
(``encode_send_ok_response``) and reads the V2 SEND header (``broker/headers.py``) when it was built and ``FERRYMQ_PURE_PYTHON`` is not set.
The Python code here is the reference and the fallback: the extension gives the same result or declines.
"""

from __future__ import annotations

import importlib
import os
import struct
from dataclasses import dataclass, field, fields
from types import ModuleType
from typing import Any

import orjson

from ferrymq.errors import FrameTooLargeError, ProtocolError
from ferrymq.remoting.codes import CURRENT_VERSION, LanguageCode

#: Largest frame (length field value) accepted; RocketMQ's default frameMaxLength.
MAX_FRAME_BYTES = 16 * 1024 * 1024
#: Largest header accepted inside a frame.
MAX_HEADER_BYTES = 4 * 1024 * 1024

FLAG_RESPONSE = 0x1
FLAG_ONEWAY = 0x2

SERIALIZE_JSON = 0
SERIALIZE_ROCKETMQ = 1

_INT = struct.Struct(">i")
_UINT = struct.Struct(">I")
#: bodies at least this large are copied out of the receive buffer through a memoryview (one copy)
_BODY_VIEW_MIN_BYTES = 4096
_PREFIX = struct.Struct(">iI")
#: a JSON frame at least this large that does not arrive in one read is kept as the received chunks and its
#: body joined from them once (instead of appending the chunks to the buffer and copying the body out of it)
_BIG_FRAME_MIN_BYTES = 16 * 1024
_BIN_FIXED = struct.Struct(">hbhii")
#: code, opaque, flag and version are Java ints
_INT32_MIN = -(2**31)
_INT32_MAX = 2**31 - 1
_LANG_BY_CODE = {m.value: m.name for m in LanguageCode}
_LANG_NAMES = frozenset(m.name for m in LanguageCode)
PURE_PYTHON_ENV = "FERRYMQ_PURE_PYTHON"


@dataclass(slots=True)
class RemotingCommand:
    """One request or response."""

    code: int
    ext_fields: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    opaque: int = 0
    flag: int = 0
    remark: str | None = None
    language: str = "PYTHON"
    version: int = CURRENT_VERSION
    serialize_type: int = SERIALIZE_JSON

    @property
    def is_response(self) -> bool:
        return bool(self.flag & FLAG_RESPONSE)

    @property
    def is_oneway(self) -> bool:
        return bool(self.flag & FLAG_ONEWAY)

    @classmethod
    def request(
        cls, code: int, ext_fields: dict[str, Any] | None = None, body: bytes = b"", oneway: bool = False
    ) -> RemotingCommand:
        fields = {k: to_wire_str(v) for k, v in (ext_fields or {}).items() if v is not None}
        return cls(code=int(code), ext_fields=fields, body=body, flag=FLAG_ONEWAY if oneway else 0)

    def response(
        self, code: int = 0, ext_fields: dict[str, Any] | None = None, body: bytes = b"", remark: str | None = None
    ) -> RemotingCommand:
        """A response to this request: same opaque and serialize type, response bit set."""
        fields = {k: to_wire_str(v) for k, v in (ext_fields or {}).items() if v is not None}
        return RemotingCommand(
            code=int(code),
            ext_fields=fields,
            body=body,
            opaque=self.opaque,
            flag=FLAG_RESPONSE,
            remark=remark,
            language="JAVA",
            serialize_type=self.serialize_type,
        )

    # typed accessors over extFields (all values are strings on the wire)
    def get_str(self, key: str, default: str | None = None) -> str | None:
        v = self.ext_fields.get(key)
        return default if v is None else v

    def get_int(self, key: str, default: int | None = None) -> int | None:
        v = self.ext_fields.get(key)
        if v is None or v == "":
            return default
        try:
            return int(v)
        except ValueError:
            try:
                return int(float(v))
            except ValueError:
                raise ProtocolError(f"header field {key!r} is not an integer: {v[:40]!r}") from None

    def get_bool(self, key: str, default: bool = False) -> bool:
        v = self.ext_fields.get(key)
        if v is None or v == "":
            return default
        return v.lower() in ("true", "1")


def to_wire_str(value: Any) -> str:
    """extFields values travel as JSON strings; bools the Java way."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def encode(cmd: RemotingCommand) -> bytes:
    """One whole frame for ``cmd``."""
    if _native_encode is not None:
        frame = _native_encode(cmd)  # a JSON command with the usual field types; None: written below
        if frame is not None:
            return frame  # type: ignore[no-any-return]
    return encode_py(cmd)


def encode_py(cmd: RemotingCommand) -> bytes:
    """``encode`` without the extension (the reference)."""
    stype = cmd.serialize_type
    header = encode_binary_header(cmd) if stype == SERIALIZE_ROCKETMQ else encode_json_header(cmd)
    body = cmd.body
    if not body:
        return _PREFIX.pack(4 + len(header), (stype << 24) | len(header)) + header
    # one join: the body is copied once (``a + b + c`` copies it twice)
    return b"".join((_PREFIX.pack(4 + len(header) + len(body), (stype << 24) | len(header)), header, body))


#: the JSON header of a SEND answer with PUT_OK, in the key order ``encode`` writes (what
#: ``encode_send_ok_response`` fills in: msgId, queueId, queueOffset, opaque)
_SEND_OK_HEADER = (
    b'{"code":0,"extFields":{"msgId":"%s","queueId":"%d","queueOffset":"%d","MSG_REGION":"DefaultRegion",'
    b'"TRACE_ON":"true"},"flag":1,"language":"JAVA","opaque":%d,"serializeTypeCurrentRPC":"JSON","version":'
    + str(CURRENT_VERSION).encode() + b"}"
)


def _load_extension() -> ModuleType | None:
    try:
        module = importlib.import_module("ferrymq.remoting._codec")
    except ImportError:
        return None
    try:
        module.set_class("command", RemotingCommand, tuple(f.name for f in fields(RemotingCommand)))
        module.set_json_loads(orjson.loads)
        # the literal parts of the SEND_OK header around its four fields (msgId, queueId, queueOffset, opaque)
        parts = _SEND_OK_HEADER.replace(b"%s", b"%d").split(b"%d")
        module.set_send_ok_template(tuple(parts))
    except (TypeError, ValueError):  # an extension built for other fields than these: the Python code runs
        return None
    return module


#: the extension whatever the environment says (tests compare it with the reference), and the one in use
EXTENSION: ModuleType | None = _load_extension()
NATIVE: ModuleType | None = None if os.environ.get(PURE_PYTHON_ENV, "") not in ("", "0") else EXTENSION
_native_send_ok = NATIVE.encode_send_ok if NATIVE is not None else None
#: ``encode_send_ok_response``'s extension call for the send processor (one frame less per send): the frame, or
#: None when the extension declines the values (then ``encode_send_ok_response`` answers); None without it
native_send_ok = _native_send_ok
_native_decode_frames = NATIVE.decode_frames if NATIVE is not None else None
_native_encode = NATIVE.encode_json if NATIVE is not None else None


def encode_send_ok_response(opaque: int, msg_id: str, queue_id: int, queue_offset: int,
                            serialize_type: int = SERIALIZE_JSON) -> bytes:
    """The whole frame of a SEND answer with code SUCCESS and extFields msgId, queueId, queueOffset,
    MSG_REGION=DefaultRegion, TRACE_ON=true (no remark, no body): byte for byte what ``encode`` writes for
    that ``RemotingCommand`` (language JAVA, current version), from a template instead of a dict and
    ``orjson.dumps``. A handler may return these bytes instead of the command (``Connection`` writes them
    as they are), so ``opaque`` must be the request's. Unusual values take the generic encoder."""
    if _native_send_ok is not None and serialize_type == SERIALIZE_JSON:
        frame = _native_send_ok(opaque, msg_id, queue_id, queue_offset)
        if frame is not None:
            return frame  # type: ignore[no-any-return]
    return encode_send_ok_response_py(opaque, msg_id, queue_id, queue_offset, serialize_type)


def encode_send_ok_response_py(opaque: int, msg_id: str, queue_id: int, queue_offset: int,
                               serialize_type: int = SERIALIZE_JSON) -> bytes:
    """``encode_send_ok_response`` without the extension (the reference)."""
    if (serialize_type == SERIALIZE_JSON and type(queue_id) is int and type(queue_offset) is int
            and type(opaque) is int and msg_id.isalnum() and msg_id.isascii()):
        header = _SEND_OK_HEADER % (msg_id.encode(), queue_id, queue_offset, opaque)
        n = len(header)
        return _PREFIX.pack(4 + n, n) + header
    return encode(RemotingCommand(
        0, {"msgId": msg_id, "queueId": str(queue_id), "queueOffset": str(queue_offset),
            "MSG_REGION": "DefaultRegion", "TRACE_ON": "true"},
        b"", opaque, FLAG_RESPONSE, None, "JAVA", CURRENT_VERSION, serialize_type))


def encode_json_header(cmd: RemotingCommand) -> bytes:
    obj: dict[str, Any] = {
        "code": cmd.code,
        "extFields": cmd.ext_fields,
        "flag": cmd.flag,
        "language": cmd.language,
        "opaque": cmd.opaque,
        "serializeTypeCurrentRPC": "JSON",
        "version": cmd.version,
    }
    if cmd.remark is not None:
        obj["remark"] = cmd.remark
    return orjson.dumps(obj)


def encode_binary_header(cmd: RemotingCommand) -> bytes:
    lang = LanguageCode[cmd.language].value if cmd.language in LanguageCode.__members__ else LanguageCode.OTHER
    remark = (cmd.remark or "").encode()
    ext = bytearray()
    for k, v in cmd.ext_fields.items():
        kb, vb = k.encode(), v.encode()
        ext += struct.pack(">h", len(kb)) + kb + _INT.pack(len(vb)) + vb
    return (
        _BIN_FIXED.pack(cmd.code, lang, cmd.version, cmd.opaque, cmd.flag)
        + _INT.pack(len(remark))
        + remark
        + _INT.pack(len(ext))
        + bytes(ext)
    )


def _coerce_ext(raw: Any) -> dict[str, str]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ProtocolError("extFields is not an object")
    try:
        "".join(raw.values())  # raises TypeError unless every value is a string
    except TypeError:
        pass
    else:
        return raw  # the usual case: every value already a string (no None, no numbers)
    out: dict[str, str] = {}
    for k, v in raw.items():
        if v is None:
            continue
        if isinstance(v, bool):
            out[k] = "true" if v else "false"
        elif isinstance(v, str):
            out[k] = v
        elif isinstance(v, (int, float)):
            out[k] = str(v)
        else:
            out[k] = orjson.dumps(v).decode()
    return out


def decode_json_header(header: bytes | bytearray, body: bytes) -> RemotingCommand:
    try:
        obj = orjson.loads(header)
    except orjson.JSONDecodeError as exc:
        raise ProtocolError(f"header is not valid JSON: {exc}") from None
    # the usual header (every client we know): all fields present with their JSON types, every extFields
    # value a string — read with subscripts, one C-level "all strings" check; anything else: the general path
    try:
        code = obj["code"]
        opaque = obj["opaque"]
        flag = obj["flag"]
        version = obj["version"]
        language = obj["language"]
        ext = obj["extFields"]
    except (KeyError, TypeError):
        return _decode_json_header_general(obj, body)
    if (type(code) is int and type(opaque) is int and type(flag) is int and type(version) is int
            and type(language) is str and type(ext) is dict and _INT32_MIN <= opaque <= _INT32_MAX):
        try:
            "".join(ext.values())  # raises TypeError unless every value is a string
        except TypeError:
            return _decode_json_header_general(obj, body)
        remark = obj.get("remark")
        # positional: RemotingCommand(code, ext_fields, body, opaque, flag, remark, language, version, type)
        return RemotingCommand(code, ext, body, opaque, flag, remark if type(remark) is str else None, language,
                               version, SERIALIZE_JSON)
    return _decode_json_header_general(obj, body)


def _decode_json_header_general(obj: Any, body: bytes) -> RemotingCommand:
    if not isinstance(obj, dict):
        raise ProtocolError("header is not a JSON object")
    get = obj.get
    code = get("code", 0)
    opaque = get("opaque", 0)
    flag = get("flag", 0)
    version = get("version", 0)
    if type(code) is not int or type(opaque) is not int or type(flag) is not int or type(version) is not int:
        try:
            code, opaque, flag, version = int(code), int(opaque), int(flag), int(version)
        except (TypeError, ValueError, OverflowError):
            raise ProtocolError("header has a non-integer code/opaque/flag/version") from None
    for name, value in (("code", code), ("opaque", opaque), ("flag", flag), ("version", version)):
        if not _INT32_MIN <= value <= _INT32_MAX:
            # every one is a Java int; the opaque is echoed in the answer, which could not be encoded
            raise ProtocolError(f"header {name} {value} is outside the 32-bit int range")
    language = get("language", "OTHER")
    if type(language) is not str:
        language = _LANG_BY_CODE.get(language, "OTHER") if isinstance(language, int) else str(language)
    remark = get("remark")
    # positional: RemotingCommand(code, ext_fields, body, opaque, flag, remark, language, version, type)
    return RemotingCommand(
        code, _coerce_ext(get("extFields")), body, opaque, flag,
        remark if type(remark) is str else None, language, version, SERIALIZE_JSON,
    )


def decode_binary_header(header: bytes, body: bytes) -> RemotingCommand:
    try:
        code, lang, version, opaque, flag = _BIN_FIXED.unpack_from(header, 0)
        pos = _BIN_FIXED.size
        (rlen,) = _INT.unpack_from(header, pos)
        pos += 4
        if rlen < 0 or pos + rlen > len(header):
            raise ProtocolError("binary header remark length out of range")
        remark = header[pos : pos + rlen].decode() if rlen else None
        pos += rlen
        (elen,) = _INT.unpack_from(header, pos)
        pos += 4
        end = pos + elen
        if elen < 0 or end > len(header):
            raise ProtocolError("binary header extFields length out of range")
        ext: dict[str, str] = {}
        while pos < end:
            (klen,) = struct.unpack_from(">h", header, pos)
            pos += 2
            k = header[pos : pos + klen].decode()
            pos += klen
            (vlen,) = _INT.unpack_from(header, pos)
            pos += 4
            if klen < 0 or vlen < 0 or pos + vlen > end:
                raise ProtocolError("binary header entry length out of range")
            ext[k] = header[pos : pos + vlen].decode()
            pos += vlen
    except (struct.error, UnicodeDecodeError) as exc:
        raise ProtocolError(f"malformed binary header: {exc}") from None
    return RemotingCommand(
        code=code,
        ext_fields=ext,
        body=body,
        opaque=opaque,
        flag=flag,
        remark=remark,
        language=_LANG_BY_CODE.get(lang, "OTHER"),
        version=version,
        serialize_type=SERIALIZE_ROCKETMQ,
    )


def decode_frame(frame: bytes | memoryview) -> RemotingCommand:
    """Decode one frame without its 4-byte length prefix."""
    if len(frame) < 4:
        raise ProtocolError("frame shorter than its header-length word")
    (word,) = struct.unpack_from(">I", frame, 0)
    stype = word >> 24
    hlen = word & 0xFFFFFF
    if stype not in (SERIALIZE_JSON, SERIALIZE_ROCKETMQ):
        raise ProtocolError(f"unknown serialize type {stype}")
    if hlen > len(frame) - 4 or hlen > MAX_HEADER_BYTES:
        raise ProtocolError(f"header length {hlen} exceeds frame length {len(frame) - 4}")
    header = bytes(frame[4 : 4 + hlen])
    body = bytes(frame[4 + hlen :])
    if stype == SERIALIZE_JSON:
        return decode_json_header(header, body)
    return decode_binary_header(header, body)


class FrameDecoder:
    """Incremental decoder: ``feed(data)`` returns the complete commands found so far.

    Raises ProtocolError / FrameTooLargeError on a bad frame; the caller closes the connection.
    An oversized length prefix is refused as soon as its 4 bytes arrive, before any body is buffered.
    A large JSON frame spread over several reads (a SEND_BATCH, a PULL answer) is kept as the received
    ``bytes`` chunks and its body is joined from them once: one copy of the body instead of two.
    """

    __slots__ = ("_buf", "max_frame_bytes", "_big", "_big_start", "_big_hlen", "_big_need", "_big_have")

    def __init__(self, max_frame_bytes: int = MAX_FRAME_BYTES) -> None:
        self._buf = bytearray()
        self.max_frame_bytes = max_frame_bytes
        #: chunks of the pending large frame (the first one holds its prefix and whole header at ``_big_start``)
        self._big: list[bytes] | None = None
        self._big_start = 0
        self._big_hlen = 0
        self._big_need = 0  # bytes of the whole frame, length prefix included
        self._big_have = 0  # of which received

    @property
    def buffered(self) -> int:
        return len(self._buf) + (self._big_have if self._big is not None else 0)

    def feed(self, data: bytes) -> list[RemotingCommand]:
        if self._big is not None:
            return self._feed_big(bytes(data) if type(data) is not bytes else data)
        buf = self._buf
        native = _native_decode_frames
        if native is None and not buf and type(data) is bytes and len(data) >= 8:
            # one whole JSON frame and nothing buffered: the usual read with one request in flight
            length, word = _PREFIX.unpack_from(data)
            hlen = word & 0xFFFFFF
            if (length == len(data) - 4 and word >> 24 == SERIALIZE_JSON and hlen <= length - 4
                    and hlen <= MAX_HEADER_BYTES and 4 <= length <= self.max_frame_bytes):
                return [decode_json_header(data[8:8 + hlen], data[8 + hlen:])]
        if buf or type(data) is not bytes:
            buf += data
            src: bytes | bytearray = buf
        else:
            # nothing buffered (the usual case: whole frames per read): decode straight from ``data``, keep
            # only an incomplete tail
            src = data
        n = len(src)
        out: list[RemotingCommand]
        if native is not None:
            # the extension takes the whole JSON frames with the usual header; the loop below the rest (an
            # incomplete tail, other frames, and the bad ones, which it refuses with its messages)
            out, pos = native(src, 0, self.max_frame_bytes, MAX_HEADER_BYTES)
            if pos == n:
                if src is buf:
                    buf.clear()
                return out
        else:
            out = []
            pos = 0
        while n - pos >= 4:
            (length,) = _INT.unpack_from(src, pos)
            if length < 4 or length > self.max_frame_bytes:
                self._buf = bytearray()
                if length > self.max_frame_bytes:
                    raise FrameTooLargeError(f"frame of {length} bytes exceeds limit {self.max_frame_bytes}")
                raise ProtocolError(f"invalid frame length {length}")
            if n - pos - 4 < length:
                break
            start = pos + 4
            (word,) = _UINT.unpack_from(src, start)
            hlen = word & 0xFFFFFF
            if word >> 24 == SERIALIZE_JSON and hlen <= length - 4 and hlen <= MAX_HEADER_BYTES:
                # decode_frame() inlined for the usual JSON frame: one copy of header and body each
                hstart = start + 4
                bstart = hstart + hlen
                bend = start + length
                if src is data:
                    body = data[bstart:bend]
                elif bend - bstart >= _BODY_VIEW_MIN_BYTES:
                    with memoryview(src) as view:
                        body = bytes(view[bstart:bend])
                else:
                    body = bytes(src[bstart:bend])
                out.append(decode_json_header(src[hstart:bstart], body))
            else:
                frame = memoryview(src)[start : start + length]
                try:
                    out.append(decode_frame(frame))
                finally:
                    frame.release()
            pos = start + length
        if src is buf:
            if pos:
                del buf[:pos]
        elif pos < n:
            if not self._start_big(data, pos):
                buf += memoryview(data)[pos:]
        return out

    def _start_big(self, data: bytes, pos: int) -> bool:
        """Keep ``data`` as the first chunk of a large JSON frame starting at ``pos`` when its prefix and whole
        header are in it (the length is already checked); False: the caller buffers the tail as usual."""
        n = len(data)
        if n - pos < 8:
            return False
        length, word = _PREFIX.unpack_from(data, pos)
        hlen = word & 0xFFFFFF
        if (length + 4 < _BIG_FRAME_MIN_BYTES or word >> 24 != SERIALIZE_JSON or hlen > length - 4
                or hlen > MAX_HEADER_BYTES or n - pos < 8 + hlen):
            return False
        self._big = [data]
        self._big_start = pos
        self._big_hlen = hlen
        self._big_need = 4 + length
        self._big_have = n - pos
        return True

    def _feed_big(self, data: bytes) -> list[RemotingCommand]:
        chunks = self._big
        assert chunks is not None
        missing = self._big_need - self._big_have
        if len(data) < missing:
            chunks.append(data)
            self._big_have += len(data)
            return []
        first = chunks[0]
        hstart = self._big_start + 8
        bstart = hstart + self._big_hlen
        self._big = None
        self._big_have = 0
        with memoryview(first) as head, memoryview(data) as tail:
            # the rest of the first chunk is all this frame's (it was incomplete), then whole chunks, then the tail
            parts: list[Any] = [head[bstart:], *chunks[1:], tail[:missing]]
            body = b"".join(parts)
            parts.clear()  # the views go before the memoryviews are released
        cmd = decode_json_header(first[hstart:bstart], body)
        if missing == len(data):
            return [cmd]
        out = [cmd]
        out += self.feed(data[missing:])
        return out
