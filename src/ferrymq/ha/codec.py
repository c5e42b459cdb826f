"""Sans-IO codec of the classic HA byte streams (RocketMQ 4.x HAService compatible).

There is no handshake, magic or length prefix beyond the tables below. All integers are
big-endian (network order).

Slave -> master: offset report (the first one is the slave's *request* offset, later ones are acks)

| off | size | field           | type  | meaning                                     |
|-----|------|-----------------|-------|---------------------------------------------|
| 0   | 8    | max_phy_offset  | int64 | the slave's commit log max physical offset  |

Master -> slave: transfer (``body_size == 0`` is a heartbeat; its offset is the next transfer offset)

| off | size      | field         | type   | meaning                                         |
|-----|-----------|---------------|--------|-------------------------------------------------|
| 0   | 8         | phy_offset    | int64  | commit log physical offset of the first body byte |
| 8   | 4         | body_size     | int32  | number of raw commit log bytes that follow      |
| 12  | body_size | body          | bytes  | raw commit log bytes, never message-aligned     |

Both decoders accept arbitrary chunking of the stream (a value split over many ``feed`` calls,
or many values in one call).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from ferrymq.errors import FrameTooLargeError, ProtocolError

__all__ = [
    "HEADER_SIZE",
    "MAX_TRANSFER_BODY_SIZE",
    "REPORT_SIZE",
    "ReportDecoder",
    "Transfer",
    "TransferDecoder",
    "decode_report",
    "decode_transfer_header",
    "encode_report",
    "encode_transfer",
    "encode_transfer_header",
]

_REPORT = struct.Struct(">q")
_HEADER = struct.Struct(">qi")

#: Bytes of one slave -> master offset report.
REPORT_SIZE = _REPORT.size  # 8
#: Bytes of one master -> slave transfer header.
HEADER_SIZE = _HEADER.size  # 12
#: Largest body a slave accepts in one transfer. RocketMQ's slave read buffer is 4 MiB, so a
#: Java master never sends more in one transfer (its default batch is 32 KiB).
MAX_TRANSFER_BODY_SIZE = 4 * 1024 * 1024 - HEADER_SIZE
#: Largest phy offset representable (int64).
MAX_PHY_OFFSET = (1 << 63) - 1


def encode_report(max_phy_offset: int) -> bytes:
    if not 0 <= max_phy_offset <= MAX_PHY_OFFSET:
        raise ValueError(f"phy offset out of range: {max_phy_offset}")
    return _REPORT.pack(max_phy_offset)


def decode_report(data: bytes) -> int:
    if len(data) != REPORT_SIZE:
        raise ProtocolError(f"HA report must be {REPORT_SIZE} bytes, got {len(data)}")
    return int(_REPORT.unpack(data)[0])


def encode_transfer_header(phy_offset: int, body_size: int) -> bytes:
    if not 0 <= phy_offset <= MAX_PHY_OFFSET:
        raise ValueError(f"phy offset out of range: {phy_offset}")
    if not 0 <= body_size <= MAX_TRANSFER_BODY_SIZE:
        raise ValueError(f"body size out of range: {body_size}")
    return _HEADER.pack(phy_offset, body_size)


def encode_transfer(phy_offset: int, body: bytes) -> bytes:
    """Header + body as one bytes object (``body == b""`` is a heartbeat)."""
    return encode_transfer_header(phy_offset, len(body)) + bytes(body)


def decode_transfer_header(data: bytes) -> tuple[int, int]:
    if len(data) != HEADER_SIZE:
        raise ProtocolError(f"HA transfer header must be {HEADER_SIZE} bytes, got {len(data)}")
    phy_offset, body_size = _HEADER.unpack(data)
    _check_header(phy_offset, body_size, MAX_TRANSFER_BODY_SIZE)
    return int(phy_offset), int(body_size)


def _check_header(phy_offset: int, body_size: int, max_body_size: int) -> None:
    if phy_offset < 0:
        raise ProtocolError(f"negative phy offset in HA transfer header: {phy_offset}")
    if body_size < 0:
        raise ProtocolError(f"negative body size in HA transfer header: {body_size}")
    if body_size > max_body_size:
        raise FrameTooLargeError(f"HA transfer body of {body_size} bytes exceeds {max_body_size}")


class ReportDecoder:
    """Incremental decoder of the slave's 8-byte reports.

    ``feed`` returns only the **last** complete report of everything received so far (the
    master ignores superseded values, like RocketMQ), or None when no new report completed.
    """

    def __init__(self) -> None:
        self._buf = bytearray()
        self.reports_decoded = 0

    def feed(self, data: bytes | bytearray | memoryview) -> int | None:
        if not data:
            return None
        n = len(data)
        if not self._buf and n % REPORT_SIZE == 0:
            # the usual case: whole reports in one read, nothing buffered -> no copy
            value = int(_REPORT.unpack_from(data, n - REPORT_SIZE)[0])
            if value < 0:
                raise ProtocolError(f"negative phy offset in HA report: {value}")
            self.reports_decoded += n // REPORT_SIZE
            return value
        self._buf += data
        complete = len(self._buf) - len(self._buf) % REPORT_SIZE
        if complete == 0:
            return None
        value = int(_REPORT.unpack_from(self._buf, complete - REPORT_SIZE)[0])
        if value < 0:
            raise ProtocolError(f"negative phy offset in HA report: {value}")
        self.reports_decoded += complete // REPORT_SIZE
        del self._buf[:complete]
        return value

    @property
    def buffered(self) -> int:
        return len(self._buf)


@dataclass(frozen=True, slots=True)
class Transfer:
    phy_offset: int
    body: bytes

    @property
    def is_heartbeat(self) -> bool:
        return not self.body

    @property
    def end_phy_offset(self) -> int:
        return self.phy_offset + len(self.body)


class TransferDecoder:
    """Incremental decoder of the master's ``[header][body]`` stream.

    Memory is bounded by ``HEADER_SIZE + max_body_size`` plus one ``feed`` argument.
    """

    def __init__(self, max_body_size: int = MAX_TRANSFER_BODY_SIZE) -> None:
        if not 0 < max_body_size <= MAX_TRANSFER_BODY_SIZE:
            raise ValueError(f"max_body_size out of range: {max_body_size}")
        self._max_body_size = max_body_size
        self._buf = bytearray()

    def feed(self, data: bytes | bytearray | memoryview) -> list[Transfer]:
        """Return every transfer completed by ``data`` (in stream order)."""
        out: list[Transfer] = []
        buf = self._buf
        if not buf and isinstance(data, bytes):
            # nothing buffered: slice the bodies straight out of ``data``; only a tail goes to the buffer
            pos = 0
            end = len(data)
            while end - pos >= HEADER_SIZE:
                phy_offset, body_size = _HEADER.unpack_from(data, pos)
                _check_header(phy_offset, body_size, self._max_body_size)
                frame_end = pos + HEADER_SIZE + body_size
                if frame_end > end:
                    break
                out.append(Transfer(phy_offset, data[pos + HEADER_SIZE : frame_end]))
                pos = frame_end
            if pos < end:
                buf += data[pos:] if pos else data
            return out
        if data:
            buf += data
        pos = 0
        end = len(buf)
        while end - pos >= HEADER_SIZE:
            phy_offset, body_size = _HEADER.unpack_from(buf, pos)
            _check_header(phy_offset, body_size, self._max_body_size)
            frame_end = pos + HEADER_SIZE + body_size
            if frame_end > end:
                break
            out.append(Transfer(int(phy_offset), bytes(buf[pos + HEADER_SIZE : frame_end])))
            pos = frame_end
        # compact: keep only the unfinished frame
        if pos:
            del buf[:pos]
        return out

    @property
    def buffered(self) -> int:
        return len(self._buf)
