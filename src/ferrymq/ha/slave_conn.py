"""Sans-IO slave side of the HA connection (RocketMQ HAClient behaviour, one connection).

The driver calls ``connection_made`` once the TCP connection is up, then feeds received bytes and
time ticks (each with ``now_ms``) and performs the outputs in order: ``SendBytes`` (an 8-byte
report), ``Appended`` (tell the broker to reput) and ``CloseConnection``. After a receive that
appended bytes the report comes *before* ``Appended``: the master's SYNC_MASTER waiters should
not wait for the slave's consume queue dispatch. Pushed bytes are written
through a narrow ``CommitLogSink`` at exactly the pushed offset.

State table (unknown (state, input) pairs raise ``ProtocolStateError``):

| state        | input     | effect                                                                    | next         |
|--------------|-----------|---------------------------------------------------------------------------|--------------|
| INIT         | CONNECTED | report_on_connect: report the local max at once                           | STREAMING    |
| INIT         | CONNECTED | otherwise (RocketMQ): wait heartbeat_interval before the first report     | AWAIT_REPORT |
| AWAIT_REPORT | TICK      | heartbeat_interval since connect -> first report; housekeeping            | STREAMING / CLOSED |
| AWAIT_REPORT | RECEIVE   | like STREAMING + RECEIVE (a master does not normally push before a report) | same         |
| STREAMING    | RECEIVE   | per transfer: local max != 0 and != pushed offset -> close; else append;   | STREAMING / CLOSED |
|              |           | then report the new max at once if it grew, then Appended                 |              |
| STREAMING    | TICK      | no report for heartbeat_interval -> report; housekeeping                  | STREAMING / CLOSED |
| any open     | CLOSE     | CloseConnection(reason)                                                   | CLOSED       |
| CLOSED       | any       | nothing                                                                   | CLOSED       |

Housekeeping: close when nothing was reported for ``housekeeping_interval_ms`` (RocketMQ's rule)
or nothing was received for that long (a live master heartbeats every 5 s, so silence means
a dead or wedged master; the driver then reconnects).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from ferrymq.errors import ProtocolError
from ferrymq.ha.codec import MAX_TRANSFER_BODY_SIZE, TransferDecoder, encode_report
from ferrymq.ha.config import HAConfig
from ferrymq.ha.conn_base import CloseConnection, SendBytes, TableConnection

__all__ = [
    "Appended",
    "CloseConnection",
    "CommitLogSink",
    "SendBytes",
    "SlaveConnection",
    "SlaveInput",
    "SlaveState",
]


class CommitLogSink(Protocol):
    """What the slave needs from its store."""

    def max_phy_offset(self) -> int: ...

    def append_at(self, phy_offset: int, data: bytes) -> bool: ...


class SlaveState(enum.Enum):
    INIT = "INIT"
    AWAIT_REPORT = "AWAIT_REPORT"
    STREAMING = "STREAMING"
    CLOSED = "CLOSED"


class SlaveInput(enum.Enum):
    CONNECTED = "CONNECTED"
    RECEIVE = "RECEIVE"
    TICK = "TICK"
    CLOSE = "CLOSE"


@dataclass(frozen=True, slots=True)
class Appended:
    """Bytes [from_phy_offset, to_phy_offset) were appended to the local commit log."""

    from_phy_offset: int
    to_phy_offset: int


Output = SendBytes | Appended | CloseConnection


class SlaveConnection(TableConnection[SlaveState, SlaveInput, Output]):
    def __init__(
        self,
        sink: CommitLogSink,
        *,
        now_ms: int,
        config: HAConfig | None = None,
        report_on_connect: bool = True,
        max_body_size: int = MAX_TRANSFER_BODY_SIZE,
    ) -> None:
        super().__init__(
            state=SlaveState.INIT,
            closed_state=SlaveState.CLOSED,
            inputs=SlaveInput,
            now_ms=now_ms,
            config=config,
        )
        self._sink = sink
        self._decoder = TransferDecoder(max_body_size)
        self._report_on_connect = report_on_connect
        self.last_reported_offset = -1
        self.last_report_ms = now_ms
        self.bytes_received = 0
        self.heartbeats_received = 0

    # ---- public inputs (receive_data, tick, close: TableConnection) ----------------------------
    def connection_made(self, now_ms: int) -> list[Output]:
        return self._dispatch(SlaveInput.CONNECTED, now_ms)

    def next_timer_ms(self) -> int | None:
        if self.state in (SlaveState.AWAIT_REPORT, SlaveState.STREAMING):
            housekeeping_at = (
                min(self.last_report_ms, self.last_read_ms) + self.config.housekeeping_interval_ms + 1
            )
            return min(housekeeping_at, self.last_report_ms + self.config.heartbeat_interval_ms)
        return None

    # ---- table handlers (lookup, _ignore, _do_close: TableConnection) -----------------------------
    def _report(self, now_ms: int, offset: int = -1) -> SendBytes:
        if offset < 0:
            offset = self._sink.max_phy_offset()
        self.last_reported_offset = offset
        self.last_report_ms = now_ms
        if self.state is SlaveState.AWAIT_REPORT:
            self.state = SlaveState.STREAMING
        return SendBytes(encode_report(offset))

    def _on_connected(self, now_ms: int, **_: object) -> list[Output]:
        self.last_read_ms = now_ms
        self.last_report_ms = now_ms
        if self._report_on_connect:
            self.state = SlaveState.STREAMING
            return [self._report(now_ms)]
        self.state = SlaveState.AWAIT_REPORT
        return []

    def _housekeeping(self, now_ms: int) -> list[Output] | None:
        limit = self.config.housekeeping_interval_ms
        if now_ms - self.last_report_ms > limit:
            return self._do_close(now_ms, f"housekeeping: no report for {now_ms - self.last_report_ms} ms")
        if now_ms - self.last_read_ms > limit:
            return self._do_close(now_ms, f"housekeeping: master silent for {now_ms - self.last_read_ms} ms")
        return None

    def _on_tick(self, now_ms: int, **_: object) -> list[Output]:
        closed = self._housekeeping(now_ms)
        if closed is not None:
            return closed
        if now_ms - self.last_report_ms >= self.config.heartbeat_interval_ms:
            return [self._report(now_ms)]
        return []

    def _on_receive(self, now_ms: int, data: object = b"", **_: object) -> list[Output]:
        assert isinstance(data, (bytes, bytearray, memoryview))
        if data:
            self.last_read_ms = now_ms
        try:
            transfers = self._decoder.feed(data)
        except ProtocolError as exc:
            return self._do_close(now_ms, f"bad transfer: {exc}")
        out: list[Output] = []
        first = -1
        last = -1
        sink = self._sink
        local_max = sink.max_phy_offset()
        for t in transfers:
            if local_max != 0 and local_max != t.phy_offset:
                out.extend(self._appended(first, last))
                out.extend(
                    self._do_close(
                        now_ms, f"master pushed offset {t.phy_offset} != slave max offset {local_max}"
                    )
                )
                return out
            if not t.body:
                self.heartbeats_received += 1
                continue
            if not sink.append_at(t.phy_offset, t.body):
                out.extend(self._appended(first, last))
                out.extend(self._do_close(now_ms, f"append_at({t.phy_offset}, {len(t.body)}) refused"))
                return out
            self.bytes_received += len(t.body)
            if first < 0:
                first = t.phy_offset
            last = t.phy_offset + len(t.body)
            local_max = sink.max_phy_offset()
        if last >= 0:
            # report first: the master releases SYNC_MASTER sends before the slave dispatches
            if local_max > self.last_reported_offset:
                out.append(self._report(now_ms, local_max))
            out.append(Appended(first, last))
        return out

    @staticmethod
    def _appended(first: int, last: int) -> list[Output]:
        return [Appended(first, last)] if last >= 0 else []


_Handler = Callable[..., list[Output]]
_TABLE: dict[tuple[SlaveState, SlaveInput], _Handler] = {
    (SlaveState.INIT, SlaveInput.CONNECTED): SlaveConnection._on_connected,
    (SlaveState.INIT, SlaveInput.CLOSE): SlaveConnection._do_close,
    (SlaveState.AWAIT_REPORT, SlaveInput.RECEIVE): SlaveConnection._on_receive,
    (SlaveState.AWAIT_REPORT, SlaveInput.TICK): SlaveConnection._on_tick,
    (SlaveState.AWAIT_REPORT, SlaveInput.CLOSE): SlaveConnection._do_close,
    (SlaveState.STREAMING, SlaveInput.RECEIVE): SlaveConnection._on_receive,
    (SlaveState.STREAMING, SlaveInput.TICK): SlaveConnection._on_tick,
    (SlaveState.STREAMING, SlaveInput.CLOSE): SlaveConnection._do_close,
    (SlaveState.CLOSED, SlaveInput.RECEIVE): SlaveConnection._ignore,
    (SlaveState.CLOSED, SlaveInput.TICK): SlaveConnection._ignore,
    (SlaveState.CLOSED, SlaveInput.CLOSE): SlaveConnection._ignore,
}
SlaveConnection._table = _TABLE
