"""Sans-IO master side of one slave connection (RocketMQ HAConnection behaviour).

The object never touches a socket or a clock: the driver feeds it bytes received, time ticks and
"new data available" signals, each with ``now_ms``, and performs the returned outputs
(``SendBytes``, ``AckReceived``, ``CloseConnection``) in order. It reads committed bytes through
a narrow ``CommitLogSource``.

State table (unknown (state, input) pairs raise ``ProtocolStateError``):

| state         | input          | effect                                                               | next          |
|---------------|----------------|----------------------------------------------------------------------|---------------|
| AWAIT_REQUEST | RECEIVE        | no complete report yet: buffer                                       | AWAIT_REQUEST |
| AWAIT_REQUEST | RECEIVE        | first report = request offset; pick start; AckReceived               | STREAMING     |
| AWAIT_REQUEST | TICK           | silent > housekeeping -> CloseConnection                             | AWAIT_REQUEST / CLOSED |
| AWAIT_REQUEST | DATA_AVAILABLE | nothing (no start offset yet)                                        | AWAIT_REQUEST |
| STREAMING     | RECEIVE        | last complete report = ack; ack > master max -> close; AckReceived   | STREAMING / CLOSED |
| STREAMING     | TICK           | silent > housekeeping -> close; idle >= heartbeat -> size-0 header   | STREAMING / CLOSED |
| STREAMING     | DATA_AVAILABLE | at most ``max_batches`` transfers from the next transfer offset      | STREAMING     |
| any open      | CLOSE          | CloseConnection(reason)                                              | CLOSED        |
| CLOSED        | any            | nothing (late bytes / timers after close)                            | CLOSED        |

Start offset: request 0 (fresh slave) -> start of the master's last segment
(``max - max % segment_size``); otherwise the slave's own offset. Each transfer holds at most
``transfer_batch_size`` bytes and never crosses a segment boundary.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from ferrymq.errors import ProtocolError
from ferrymq.ha.codec import MAX_TRANSFER_BODY_SIZE, ReportDecoder, encode_transfer_header
from ferrymq.ha.config import HAConfig
from ferrymq.ha.conn_base import CloseConnection, ProtocolStateError, SendBytes, TableConnection

__all__ = [
    "AckReceived",
    "CloseConnection",
    "CommitLogSource",
    "MasterConnection",
    "MasterInput",
    "MasterState",
    "ProtocolStateError",
    "SendBytes",
]


class CommitLogSource(Protocol):
    """What the master needs from its store."""

    def max_phy_offset(self) -> int: ...

    def read_from(self, phy_offset: int, max_bytes: int) -> bytes: ...


class MasterState(enum.Enum):
    AWAIT_REQUEST = "AWAIT_REQUEST"
    STREAMING = "STREAMING"
    CLOSED = "CLOSED"


class MasterInput(enum.Enum):
    RECEIVE = "RECEIVE"
    TICK = "TICK"
    DATA_AVAILABLE = "DATA_AVAILABLE"
    CLOSE = "CLOSE"


@dataclass(frozen=True, slots=True)
class AckReceived:
    ack_phy_offset: int
    is_request: bool


Output = SendBytes | AckReceived | CloseConnection


class MasterConnection(TableConnection[MasterState, MasterInput, Output]):
    def __init__(
        self,
        source: CommitLogSource,
        *,
        segment_size: int,
        now_ms: int,
        config: HAConfig | None = None,
    ) -> None:
        if segment_size <= 0:
            raise ValueError("segment_size must be > 0")
        super().__init__(
            state=MasterState.AWAIT_REQUEST,
            closed_state=MasterState.CLOSED,
            inputs=MasterInput,
            now_ms=now_ms,
            config=config,
        )
        if self.config.transfer_batch_size > MAX_TRANSFER_BODY_SIZE:
            raise ValueError(f"transfer_batch_size above {MAX_TRANSFER_BODY_SIZE}")
        self._source = source
        self._segment_size = segment_size
        self._reports = ReportDecoder()
        self.request_offset = -1
        self.ack_offset = -1
        self.next_transfer_offset = -1
        self.last_write_ms = now_ms
        self.bytes_sent = 0

    # ---- public inputs (receive_data, tick, close: TableConnection) ----------------------------
    def data_available(self, now_ms: int, max_batches: int = 1) -> list[Output]:
        return self._dispatch(MasterInput.DATA_AVAILABLE, now_ms, max_batches=max_batches)

    def next_timer_ms(self) -> int | None:
        """The earliest time a ``tick`` has something to do (None when closed)."""
        housekeeping_at = self.last_read_ms + self.config.housekeeping_interval_ms + 1
        if self.state is MasterState.AWAIT_REQUEST:
            return housekeeping_at
        if self.state is MasterState.STREAMING:
            return min(housekeeping_at, self.last_write_ms + self.config.heartbeat_interval_ms)
        return None

    # ---- table handlers (lookup, _ignore, _do_close: TableConnection) -----------------------------
    def _on_receive(self, now_ms: int, data: object = b"", **_: object) -> list[Output]:
        assert isinstance(data, (bytes, bytearray, memoryview))
        if data:
            self.last_read_ms = now_ms
        try:
            value = self._reports.feed(bytes(data))
        except ProtocolError as exc:
            return self._do_close(now_ms, f"bad report: {exc}")
        if value is None:
            return []
        master_max = self._source.max_phy_offset()
        if value > master_max:
            return self._do_close(now_ms, f"slave offset {value} beyond master max offset {master_max}")
        self.ack_offset = value
        if self.state is MasterState.AWAIT_REQUEST:
            self.request_offset = value
            if value == 0:
                start = master_max - master_max % self._segment_size
            else:
                start = value
            self.next_transfer_offset = max(0, start)
            self.state = MasterState.STREAMING
            # the heartbeat clock starts when streaming starts
            self.last_write_ms = now_ms
            return [AckReceived(value, True)]
        return [AckReceived(value, False)]

    def _housekeeping(self, now_ms: int) -> list[Output] | None:
        silent_ms = now_ms - self.last_read_ms
        if silent_ms > self.config.housekeeping_interval_ms:
            return self._do_close(now_ms, f"housekeeping: slave silent for {silent_ms} ms")
        return None

    def _on_tick_awaiting(self, now_ms: int, **_: object) -> list[Output]:
        return self._housekeeping(now_ms) or []

    def _on_tick_streaming(self, now_ms: int, **_: object) -> list[Output]:
        closed = self._housekeeping(now_ms)
        if closed is not None:
            return closed
        if now_ms - self.last_write_ms >= self.config.heartbeat_interval_ms:
            self.last_write_ms = now_ms
            return [SendBytes(encode_transfer_header(self.next_transfer_offset, 0))]
        return []

    def _on_data(self, now_ms: int, max_batches: object = 1, **_: object) -> list[Output]:
        assert isinstance(max_batches, int) and max_batches > 0
        out: list[Output] = []
        for _i in range(max_batches):
            offset = self.next_transfer_offset
            segment_left = self._segment_size - offset % self._segment_size
            want = min(self.config.transfer_batch_size, segment_left)
            body = self._source.read_from(offset, want)
            if not body:
                break
            if len(body) > want:  # a source must not over-deliver; never send across a segment
                body = body[:want]
            n = len(body)
            out.append(SendBytes(encode_transfer_header(offset, n) + bytes(body)))
            self.next_transfer_offset = offset + n
            self.bytes_sent += n
            self.last_write_ms = now_ms
            if n < want:
                break  # short read: the wrote position of the last segment, nothing more yet
        return out


_Handler = Callable[..., list[Output]]
_TABLE: dict[tuple[MasterState, MasterInput], _Handler] = {
    (MasterState.AWAIT_REQUEST, MasterInput.RECEIVE): MasterConnection._on_receive,
    (MasterState.AWAIT_REQUEST, MasterInput.TICK): MasterConnection._on_tick_awaiting,
    (MasterState.AWAIT_REQUEST, MasterInput.DATA_AVAILABLE): MasterConnection._ignore,
    (MasterState.AWAIT_REQUEST, MasterInput.CLOSE): MasterConnection._do_close,
    (MasterState.STREAMING, MasterInput.RECEIVE): MasterConnection._on_receive,
    (MasterState.STREAMING, MasterInput.TICK): MasterConnection._on_tick_streaming,
    (MasterState.STREAMING, MasterInput.DATA_AVAILABLE): MasterConnection._on_data,
    (MasterState.STREAMING, MasterInput.CLOSE): MasterConnection._do_close,
    (MasterState.CLOSED, MasterInput.RECEIVE): MasterConnection._ignore,
    (MasterState.CLOSED, MasterInput.TICK): MasterConnection._ignore,
    (MasterState.CLOSED, MasterInput.DATA_AVAILABLE): MasterConnection._ignore,
    (MasterState.CLOSED, MasterInput.CLOSE): MasterConnection._ignore,
}
MasterConnection._table = _TABLE
