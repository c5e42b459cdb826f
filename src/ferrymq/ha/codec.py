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
    "DEFAULT_BUFFER_CAPACITY",
    "DEFAULT_READ_CHUNK",
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
#: Slave receive buffer: at most this many bytes are handed to one socket read (bigger reads mean
#: fewer read callbacks and reports per byte; 256 KiB keeps a read's bytes in cache until appended).
DEFAULT_READ_CHUNK = 256 * 1024
#: Slave receive buffer capacity (an unfinished frame moves to the front only when the tail runs short).
DEFAULT_BUFFER_CAPACITY = 4 * 1024 * 1024
#: A free tail shorter than this is compacted away instead of being handed to a read.
MIN_READ = 64 * 1024


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
    """Incremental decoder of the master's ``[header][body]`` stream over one preallocated buffer.

    Two ways in, one buffer:

    * zero-copy (an ``asyncio.BufferedProtocol`` receiving straight into it): ``get_buffer()`` hands
      out the free region after the unparsed bytes, the socket reads into it, ``take_frames(nbytes)``
      returns every completed transfer as ``(phy_offset, body)`` where ``body`` is a ``memoryview``
      **into the buffer**, valid until the next ``get_buffer`` / ``feed`` (the slave writes it out
      to the commit log right away, so a body is copied once, socket -> buffer, before the store);
    * ``feed(data)``: copies ``data`` in and returns ``Transfer`` objects with ``bytes`` bodies.

    Only an unfinished frame is ever moved (to the front, when the free tail runs short), so a
    read of N bytes costs no user-space copy beyond that one frame per ``capacity`` bytes.
    Memory: ``capacity`` (grown once to ``HEADER_SIZE + max_body_size`` plus one read chunk if a
    frame that large arrives).
    """

    def __init__(
        self,
        max_body_size: int = MAX_TRANSFER_BODY_SIZE,
        *,
        read_chunk: int = DEFAULT_READ_CHUNK,
        capacity: int = 0,
    ) -> None:
        if not 0 < max_body_size <= MAX_TRANSFER_BODY_SIZE:
            raise ValueError(f"max_body_size out of range: {max_body_size}")
        if read_chunk <= 0:
            raise ValueError(f"read_chunk must be > 0: {read_chunk}")
        self._max_body_size = max_body_size
        self._read_chunk = read_chunk
        #: a free tail shorter than this is not handed out: the unfinished frame moves to the front
        self._min_free = min(read_chunk, MIN_READ)
        cap = capacity or DEFAULT_BUFFER_CAPACITY
        # a small max_body_size (tests) needs no megabytes of buffer
        cap = max(min(cap, 4 * (HEADER_SIZE + max_body_size) + read_chunk), read_chunk + HEADER_SIZE)
        self._buf = bytearray(cap)
        self._view = memoryview(self._buf)
        self._head = self._view[:read_chunk]  # the region handed out while nothing is buffered
        self._start = 0  # first unparsed byte
        self._end = 0  # end of received bytes
        self._frame_size = 0  # header + body of the unfinished frame at _start, 0 while its header is incomplete

    # ---- zero-copy path ----------------------------------------------------------------------------
    def get_buffer(self, sizehint: int = -1) -> memoryview:
        """The writable region the next received bytes go to (never empty, at most ``read_chunk``)."""
        start = self._start
        end = self._end
        if start == end:  # nothing unfinished (the idle stream: every SYNC_MASTER push)
            self._start = self._end = 0
            return self._head
        cap = len(self._buf)
        if cap - end < self._min_free or start + self._frame_size > cap:
            need = max(self._frame_size, end - start) + self._read_chunk
            if need > cap:
                self._grow(need)
            else:
                n = end - start
                self._view[:n] = self._view[start:end]  # memmove of the unfinished frame only
                self._start = 0
                self._end = n
            end = self._end
            cap = len(self._buf)
        return self._view[end : min(cap, end + self._read_chunk)]

    def _grow(self, capacity: int) -> None:
        n = self._end - self._start
        buf = bytearray(capacity)
        buf[:n] = self._view[self._start : self._end]
        self._buf = buf  # the old buffer goes when its last view does
        self._view = memoryview(buf)
        self._head = self._view[: self._read_chunk]
        self._start = 0
        self._end = n

    def unparsed(self, n: int) -> bytes:
        """Up to ``n`` received bytes not parsed yet (what a bad header was made of, for the error message)."""
        return bytes(self._view[self._start : min(self._end, self._start + n)])

    def take_frames(self, nbytes: int) -> list[tuple[int, memoryview]]:
        """``nbytes`` were written at the start of the last ``get_buffer()`` region: return every
        transfer now complete, bodies as views into the buffer (valid until the next ``get_buffer``).
        Raises ``ProtocolError`` on a bad header (nothing of that read is returned then)."""
        end = self._end + nbytes
        if end > len(self._buf) or nbytes < 0:
            raise ValueError(f"buffer_updated({nbytes}) beyond the region handed out")
        self._end = end
        pos = self._start
        if end - pos < self._frame_size:
            return []  # the unfinished frame is still unfinished
        out: list[tuple[int, memoryview]] = []
        buf = self._buf
        view = self._view
        max_body = self._max_body_size
        unpack_from = _HEADER.unpack_from
        while end - pos >= HEADER_SIZE:
            phy_offset, body_size = unpack_from(buf, pos)
            if phy_offset < 0 or body_size < 0 or body_size > max_body:
                _check_header(phy_offset, body_size, max_body)
            frame_end = pos + HEADER_SIZE + body_size
            if frame_end > end:
                self._start = pos
                self._frame_size = frame_end - pos
                return out
            out.append((phy_offset, view[pos + HEADER_SIZE : frame_end]))
            pos = frame_end
        self._start = pos
        self._frame_size = 0
        return out

    def clear(self) -> None:
        """Drop everything buffered (the connection is closed)."""
        self._start = self._end = self._frame_size = 0

    # ---- copying path ------------------------------------------------------------------------------
    def feed(self, data: bytes | bytearray | memoryview) -> list[Transfer]:
        """Return every transfer completed by ``data`` (in stream order), bodies as ``bytes``."""
        out: list[Transfer] = []
        src = memoryview(data).cast("B")
        pos = 0
        total = len(src)
        while pos < total:
            region = self.get_buffer()
            n = min(len(region), total - pos)
            region[:n] = src[pos : pos + n]
            pos += n
            out.extend(Transfer(phy_offset, body.tobytes()) for phy_offset, body in self.take_frames(n))
        return out

    @property
    def buffered(self) -> int:
        """Received bytes not yet returned as transfers (an unfinished frame)."""
        return self._end - self._start
