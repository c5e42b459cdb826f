"""Sans-IO slave side of the HA connection (RocketMQ HAClient behaviour, one connection).

The driver calls ``connection_made`` once the TCP connection is up, then feeds received bytes and
time ticks (each with ``now_ms``) and performs the outputs in order: ``SendBytes`` (an 8-byte
report), ``Appended`` (tell the broker to reput) and ``CloseConnection``. After a receive that
appended bytes the report comes *before* ``Appended``: the master's SYNC_MASTER waiters should
not wait for the slave's consume queue dispatch. Pushed bytes are written
through a narrow ``CommitLogSink`` at exactly the pushed offset.

Bytes come in either zero-copy (``get_buffer()`` → the socket reads into it → ``buffer_updated(n)``,
the ``asyncio.BufferedProtocol`` calls: each body reaches ``append_at`` as a view into the receive
buffer) or as a bytes object (``receive_data``, copied into the same buffer).

Reports after a receive that appended (RECEIVE row below): the read ended on a transfer boundary
(nothing buffered: the stream is idle, as after every SYNC_MASTER push) -> report at once, inside
the same receive; the read ended inside the next transfer (catch-up: its rest is already in
flight, and the read that completes it reports) -> report only once ``report_every_bytes`` (1 MiB)
are unreported or ``report_max_delay_ms`` (10 ms) passed since the last report.

State table (unknown (state, input) pairs raise ``ProtocolStateError``):

| state        | input     | effect                                                                    | next         |
|--------------|-----------|---------------------------------------------------------------------------|--------------|
| INIT         | CONNECTED | report_on_connect: report the local max at once                           | STREAMING    |
| INIT         | CONNECTED | otherwise (RocketMQ): wait heartbeat_interval before the first report     | AWAIT_REPORT |
| AWAIT_REPORT | TICK      | heartbeat_interval since connect -> first report; housekeeping            | STREAMING / CLOSED |
| AWAIT_REPORT | RECEIVE   | like STREAMING + RECEIVE (a master does not normally push before a report) | same         |
| STREAMING    | RECEIVE   | per transfer: local max != 0 and != pushed offset -> close; else append;   | STREAMING / CLOSED |
|              |           | then report the new max if it grew (see above), then Appended             |              |
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
from ferrymq.ha.auth import CHALLENGE_MAGIC
from ferrymq.ha.codec import DEFAULT_READ_CHUNK, MAX_TRANSFER_BODY_SIZE, TransferDecoder, encode_report
from ferrymq.ha.config import DEFAULT_REPORT_EVERY_BYTES, DEFAULT_REPORT_MAX_DELAY_MS, HAConfig
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

    def append_at(self, phy_offset: int, data: bytes | memoryview) -> bool:
        """Append ``data`` at exactly ``phy_offset``. ``data`` may be a view into the receive buffer,
        valid only during the call: write it out (or copy it) before returning."""
        ...


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
        read_chunk: int = DEFAULT_READ_CHUNK,
        report_every_bytes: int = DEFAULT_REPORT_EVERY_BYTES,
        report_max_delay_ms: int = DEFAULT_REPORT_MAX_DELAY_MS,
    ) -> None:
        super().__init__(
            state=SlaveState.INIT,
            closed_state=SlaveState.CLOSED,
            inputs=SlaveInput,
            now_ms=now_ms,
            config=config,
        )
        self._sink = sink
        self._decoder = TransferDecoder(max_body_size, read_chunk=read_chunk)
        self._report_every_bytes = report_every_bytes
        self._report_max_delay_ms = report_max_delay_ms
        #: appended bytes not reported yet (the last read ended inside a frame whose rest is in flight)
        self._report_deferred = False
        self._report_on_connect = report_on_connect
        self.last_reported_offset = -1
        self.last_report_ms = now_ms
        self.bytes_received = 0
        self.heartbeats_received = 0

    # ---- public inputs (tick, close: TableConnection) -------------------------------------------
    def connection_made(self, now_ms: int) -> list[Output]:
        return self._dispatch(SlaveInput.CONNECTED, now_ms)

    def get_buffer(self, sizehint: int = -1) -> memoryview:
        """Where the next received bytes go (``asyncio.BufferedProtocol.get_buffer``); never empty.
        After writing n bytes there, call ``buffer_updated(n, now_ms)`` before the next ``get_buffer``."""
        if self.state is _CLOSED:
            self._decoder.clear()  # late bytes after close are dropped
        return self._decoder.get_buffer(sizehint)

    def buffer_updated(self, nbytes: int, now_ms: int) -> list[Output]:
        """RECEIVE input: ``nbytes`` were written into the last ``get_buffer()`` region."""
        if self.state is _STREAMING:  # the hot row of the table, without the lookup
            return self._on_receive(now_ms, nbytes)
        return self._dispatch(SlaveInput.RECEIVE, now_ms, nbytes=nbytes)

    def receive_data(self, data: bytes | bytearray | memoryview, now_ms: int) -> list[Output]:
        """RECEIVE input from a bytes object: copied into the receive buffer, then ``buffer_updated``."""
        src = memoryview(data).cast("B")
        total = len(src)
        if not total:
            return self.buffer_updated(0, now_ms)
        out: list[Output] = []
        pos = 0
        while pos < total and self.state is not SlaveState.CLOSED:
            region = self.get_buffer()
            n = min(len(region), total - pos)
            region[:n] = src[pos : pos + n]
            pos += n
            out.extend(self.buffer_updated(n, now_ms))
        return out

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
        self._report_deferred = False
        if self.state is _AWAIT_REPORT:
            self.state = _STREAMING
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

    def _on_receive(self, now_ms: int, nbytes: object = 0, **_: object) -> list[Output]:
        assert isinstance(nbytes, int)
        if not nbytes:
            return []
        self.last_read_ms = now_ms
        decoder = self._decoder
        try:
            frames = decoder.take_frames(nbytes)
        except ProtocolError as exc:
            if decoder.unparsed(len(CHALLENGE_MAGIC)) == CHALLENGE_MAGIC:
                # the stream opens with an HA authentication challenge, not a transfer header
                return self._do_close(now_ms, "the master refused the handshake: it requires HA authentication "
                                              "(haSecret is set on the master, not on this slave)")
            return self._do_close(now_ms, f"bad transfer: {exc}")
        if not frames:
            return []
        out: list[Output] = []
        first = -1
        last = -1
        sink = self._sink
        local_max = sink.max_phy_offset()
        for phy_offset, body in frames:
            if local_max != 0 and local_max != phy_offset:
                out.extend(self._appended(first, last))
                out.extend(
                    self._do_close(now_ms, f"master pushed offset {phy_offset} != slave max offset {local_max}")
                )
                return out
            size = len(body)
            if not size:
                self.heartbeats_received += 1
                continue
            # ``body`` is a view into the receive buffer: the store writes it out before returning
            if not sink.append_at(phy_offset, body):
                out.extend(self._appended(first, last))
                out.extend(self._do_close(now_ms, f"append_at({phy_offset}, {size}) refused"))
                return out
            self.bytes_received += size
            if first < 0:
                first = phy_offset
            last = phy_offset + size
            local_max = sink.max_phy_offset()
        # report first (the master releases SYNC_MASTER sends before the slave dispatches): at once
        # when this read ended on a frame boundary (the stream is idle, e.g. every SYNC_MASTER push);
        # mid-stream (catch-up: the read ended inside the next frame, whose rest is in flight) only
        # every ``report_every_bytes`` or ``report_max_delay_ms``
        if last >= 0 or self._report_deferred:
            unreported = local_max - self.last_reported_offset
            if unreported <= 0:
                self._report_deferred = False
            elif (
                not decoder.buffered
                or unreported >= self._report_every_bytes
                or now_ms - self.last_report_ms >= self._report_max_delay_ms
            ):
                out.append(self._report(now_ms, local_max))
            else:
                self._report_deferred = True
        if last >= 0:
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
_AWAIT_REPORT = SlaveState.AWAIT_REPORT
_STREAMING = SlaveState.STREAMING
_CLOSED = SlaveState.CLOSED
