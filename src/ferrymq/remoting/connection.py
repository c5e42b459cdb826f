"""An asyncio Protocol carrying remoting frames in both directions.

One class serves both sides: brokers send requests to clients on the client's own connection
(NOTIFY_CONSUMER_IDS_CHANGED), so every connection has a dispatcher for incoming requests and a
table of pending outgoing requests keyed by this connection's own ``opaque`` counter.

Requests on one connection are served concurrently: a handler may return a command directly (fast
path, answered inline) or an awaitable (run as a task, answered when it completes).

Outgoing requests with a timeout share one timer per connection (armed for the earliest deadline; when it
fires, every expired request fails with RemotingTimeoutError), instead of a ``wait_for`` (an extra future,
a timer handle and callbacks) per request.

Writes are coalesced per connection, so frames produced together leave in one ``write`` (one syscall):

* the answers to the requests of one read (``data_received``) are collected and written once at its end;
* outside a read (answers of handlers that completed later, a client's requests), a frame goes out at once
  when the connection has written nothing since its last read (the request/response case: no added
  latency, no added callback); a further frame before the next read is collected and the collected
  frames are written by one ``loop.call_soon`` callback, i.e. once per event-loop iteration.

Frames are written in the order they were sent; ``close()`` writes what is collected first.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import ssl
import time
from collections.abc import Awaitable, Callable
from typing import Any

from ferrymq.common import aio, tls
from ferrymq.errors import (
    ConnectError,
    ConnectionClosedError,
    FerryError,
    ProtocolError,
    RemotingTimeoutError,
)
from ferrymq.remoting.codec import (
    FLAG_ONEWAY,
    FLAG_RESPONSE,
    MAX_FRAME_BYTES,
    FrameDecoder,
    RemotingCommand,
    encode,
)
from ferrymq.remoting.codes import ResponseCode
from ferrymq.remoting.limits import ServerBudget

log = logging.getLogger(__name__)

#: a handler answers with a command, or with the whole frame already encoded (``bytes``, carrying the
#: request's opaque, e.g. ``codec.encode_send_ok_response``), or None (no answer), or an awaitable of those
HandlerResult = RemotingCommand | bytes | None | Awaitable[RemotingCommand | bytes | None]
Handler = Callable[["Connection", RemotingCommand], HandlerResult]

#: Requests served at once on one connection before SYSTEM_BUSY answers.
MAX_INFLIGHT_REQUESTS_PER_CONNECTION = 65536
#: Outgoing requests awaiting an answer on one connection.
MAX_PENDING_REQUESTS_PER_CONNECTION = 65536
DEFAULT_TIMEOUT_MS = 3000
CONNECT_TIMEOUT_MS = 3000
#: frames collected for one write are written as soon as they pass this many bytes (so a read of many
#: requests with big answers meets the write buffer's high-water mark answer by answer, as uncollected writes do)
MAX_COLLECTED_BYTES = 256 * 1024


class Dispatcher:
    """Request code → handler. Shared by servers and clients. (``Connection`` reads ``_handlers`` directly on
    the per-request path instead of calling ``get``.)"""

    def __init__(self) -> None:
        self._handlers: dict[int, Handler] = {}

    def register(self, code: int, handler: Handler) -> None:
        self._handlers[int(code)] = handler

    def get(self, code: int) -> Handler | None:
        return self._handlers.get(code)

    def codes(self) -> list[int]:
        return sorted(self._handlers)


class Connection(asyncio.Protocol):
    """One TCP connection speaking remoting frames."""

    def __init__(
        self,
        dispatcher: Dispatcher | None = None,
        *,
        on_close: Callable[[Connection], None] | None = None,
        max_frame_bytes: int = MAX_FRAME_BYTES,
        budget: ServerBudget | None = None,
    ) -> None:
        self.dispatcher = dispatcher or Dispatcher()
        #: the server side's shared limits (None on a client's connection: see remoting/limits.py)
        self._budget = budget
        #: bytes of an unfinished frame counted in the budget, and since when (monotonic s; 0 = none)
        self._partial_bytes = 0
        self._partial_since = 0.0
        self._admitted_ip: str | None = None
        self._reading_paused = False
        #: requests read but not served while reading is paused (at most one read's worth)
        self._held: list[RemotingCommand] = []
        self._on_close = on_close
        self._decoder = FrameDecoder(max_frame_bytes)
        self._transport: asyncio.Transport | None = None
        #: opaque -> (future, deadline in loop time or None, request code, timeout in ms)
        self._pending: dict[int, tuple[asyncio.Future[RemotingCommand], float | None, int, int]] = {}
        self._opaque = itertools.count(1)
        self._loop: asyncio.AbstractEventLoop | None = None
        #: the one timer of this connection's request deadlines, and when it fires
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self._tasks: set[asyncio.Task[Any]] = set()
        self._closed_fut: asyncio.Future[None] | None = None
        self._write_paused = False
        self._drain_waiters: list[asyncio.Future[None]] = []
        #: frames collected for one write (see the module docstring), in send order, and their bytes
        self._out: list[bytes] = []
        self._out_bytes = 0
        #: inside ``data_received``/``resume_writing``: frames are collected and written at the end
        self._corked = False
        #: a frame was written outside a read since the last read: further frames are collected
        self._wrote_since_read = False
        #: a ``call_soon`` of ``_flush_out`` is pending
        self._flush_scheduled = False
        self.closed = False
        self.close_reason: BaseException | None = None
        self.peer_addr = ""
        self.local_addr = ""
        self.last_activity = time.monotonic()
        #: free slot for the owning layer (channel info, client id, ...)
        self.attributes: dict[str, Any] = {}

    # ---- asyncio.Protocol -------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses; they quack the same
        self._transport = transport  # type: ignore[assignment]
        self._loop = loop = asyncio.get_running_loop()
        self._closed_fut = loop.create_future()
        peer = transport.get_extra_info("peername")
        sock = transport.get_extra_info("sockname")
        if peer:
            self.peer_addr = f"{peer[0]}:{peer[1]}"
        if sock:
            self.local_addr = f"{sock[0]}:{sock[1]}"
        if self._budget is not None:
            self._admit(self._budget, str(peer[0]) if peer else "")

    def _admit(self, budget: ServerBudget, ip: str) -> None:
        limits = budget.limits
        count = budget.per_address.get(ip, 0)
        if budget.connections >= limits.max_connections:
            reason = f"{limits.max_connections} connections open (maxConnections)"
        elif count >= limits.max_connections_per_address:
            reason = f"{count} connections open from {ip} (maxConnectionsPerAddress)"
        else:
            budget.connections += 1
            budget.per_address[ip] = count + 1
            self._admitted_ip = ip
            self._transport.set_write_buffer_limits(high=limits.write_high_water_bytes)  # type: ignore[union-attr]
            return
        log.warning("refusing connection from %s: %s", self.peer_addr, reason)
        self.abort()

    def data_received(self, data: bytes) -> None:
        self.last_activity = now = time.monotonic()
        decoder = self._decoder
        try:
            commands = decoder.feed(data)
        except ProtocolError as exc:
            log.warning("closing %s: %s", self.peer_addr, exc)
            self.close(exc)
            return
        budget = self._budget
        if budget is not None and (self._partial_bytes or decoder.buffered):
            if self._account_partial(budget, decoder.buffered, now, bool(commands)):
                return
        self._wrote_since_read = False
        self._corked = True
        try:
            for cmd in commands:
                if cmd.flag & FLAG_RESPONSE:
                    entry = self._pending.pop(cmd.opaque, None)
                    if entry is not None and not entry[0].done():
                        entry[0].set_result(cmd)
                elif self._reading_paused:
                    # the peer does not take its answers: the rest of this read waits until it does
                    self._held.append(cmd)
                else:
                    self._serve(cmd)
        finally:
            self._corked = False
            if self._out:
                self._write_out()

    def _account_partial(self, budget: ServerBudget, buffered: int, now: float, completed: bool) -> bool:
        """Count this connection's unfinished frame in the server's budget; close the connection (True)
        when the frame is late or the server holds too many unfinished bytes. ``completed``: this read
        finished a frame, so what is buffered now begins the next one (its deadline starts now)."""
        budget.partial_bytes += buffered - self._partial_bytes
        self._partial_bytes = buffered
        if not buffered:
            self._partial_since = 0.0
            return False
        if completed or not self._partial_since:
            self._partial_since = now
        limits = budget.limits
        if budget.partial_bytes > limits.max_partial_bytes_total:
            reason = (f"unfinished frames of all connections hold {budget.partial_bytes} bytes "
                      f"(limit {limits.max_partial_bytes_total})")
        elif (now - self._partial_since) * 1000 > limits.frame_deadline_ms:
            reason = f"a frame took longer than {limits.frame_deadline_ms} ms to arrive (frameDeadlineMs)"
        else:
            return False
        log.warning("closing %s: %s", self.peer_addr, reason)
        self.close(ProtocolError(reason))
        return True

    def frame_overdue(self, now: float) -> bool:
        """Whether an unfinished frame has waited past the frame deadline (the server's scan asks)."""
        budget = self._budget
        return (budget is not None and bool(self._partial_since)
                and (now - self._partial_since) * 1000 > budget.limits.frame_deadline_ms)

    def write_buffer_size(self) -> int:
        transport = self._transport
        return transport.get_write_buffer_size() if transport is not None and not self.closed else 0

    def connection_lost(self, exc: Exception | None) -> None:
        self._teardown(exc or ConnectionClosedError(f"connection to {self.peer_addr} closed"))

    def pause_writing(self) -> None:
        self._write_paused = True
        if self._budget is not None and self._transport is not None and not self.closed:
            # the peer does not take its answers: read no more requests from it until it does
            self._transport.pause_reading()
            self._reading_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        if self._reading_paused and self._transport is not None and not self.closed:
            self._reading_paused = False
            held, self._held = self._held, []
            self._corked = True
            try:
                for i, cmd in enumerate(held):
                    if self._reading_paused or self.closed:
                        self._held = held[i:] if not self.closed else []
                        break
                    self._serve(cmd)
            finally:
                self._corked = False
                if self._out:
                    self._write_out()
            if not self._reading_paused and not self.closed:
                self._transport.resume_reading()
        waiters, self._drain_waiters = self._drain_waiters, []
        for w in waiters:
            if not w.done():
                w.set_result(None)

    def _check_write_buffer(self) -> None:
        """While writing is paused (answers pile up for a peer that does not read), close the connection
        once its buffered answers pass ``max_write_buffer_bytes``."""
        budget = self._budget
        if budget is None or self._transport is None or self.closed:
            return
        size = self._transport.get_write_buffer_size()
        limit = budget.limits.max_write_buffer_bytes
        if size > limit:
            reason = f"{size} bytes of answers not taken by the peer (limit {limit})"
            log.warning("closing %s: %s", self.peer_addr, reason)
            self.abort()

    # ---- serving incoming requests -----------------------------------------
    def _serve(self, cmd: RemotingCommand) -> None:
        handler = self.dispatcher._handlers.get(cmd.code)
        if handler is None:
            self._reply(cmd, cmd.response(
                ResponseCode.REQUEST_CODE_NOT_SUPPORTED, remark=f" request type {cmd.code} not supported"))
            return
        if len(self._tasks) >= MAX_INFLIGHT_REQUESTS_PER_CONNECTION:
            self._reply(cmd, cmd.response(ResponseCode.SYSTEM_BUSY, remark="[OVERLOAD] too many requests in flight"))
            return
        try:
            result = handler(self, cmd)
        except Exception as exc:  # a handler fault answers SYSTEM_ERROR; the connection lives on
            self._reply(cmd, self._error_response(cmd, exc))
            return
        rtype = type(result)
        if rtype is RemotingCommand or rtype is bytes:
            # _reply() + send() inlined for the usual answers (collected: _serve runs inside a read)
            if cmd.flag & FLAG_ONEWAY or self.closed:
                return
            if self._transport is None:
                raise ConnectionClosedError(f"connection to {self.peer_addr} is closed")
            if rtype is bytes:
                data: bytes = result  # type: ignore[assignment]
            else:
                result.opaque = cmd.opaque  # type: ignore[union-attr]
                data = encode(result)  # type: ignore[arg-type]
            self._out.append(data)
            self._out_bytes += len(data)
            if not self._corked or self._out_bytes > MAX_COLLECTED_BYTES:
                self._write_out()
            return
        if result is None or isinstance(result, (RemotingCommand, bytes)):
            self._reply(cmd, result)
            return
        task = asyncio.ensure_future(result)
        self._tasks.add(task)
        task.add_done_callback(functools.partial(self._task_done, cmd))

    def _task_done(self, cmd: RemotingCommand, task: asyncio.Future[Any]) -> None:
        self._tasks.discard(task)  # type: ignore[arg-type]
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            self._reply(cmd, self._error_response(cmd, exc))
        else:
            self._reply(cmd, task.result())

    def _error_response(self, cmd: RemotingCommand, exc: BaseException) -> RemotingCommand:
        if not isinstance(exc, FerryError):
            log.exception("handler for code %s failed", cmd.code, exc_info=exc)
        return cmd.response(ResponseCode.SYSTEM_ERROR, remark=f"{type(exc).__name__}: {exc}")

    def _reply(self, request: RemotingCommand, response: RemotingCommand | bytes | None) -> None:
        if response is None or request.is_oneway or self.closed:
            return
        if not isinstance(response, bytes):
            response.opaque = request.opaque
        self.send(response)

    # ---- sending -------------------------------------------------------------
    def send(self, cmd: RemotingCommand | bytes) -> None:
        """Write one command, or one already encoded frame (``bytes``): at once, or collected with the other
        frames of this read / loop iteration into one write (module docstring)."""
        transport = self._transport
        if transport is None or self.closed:
            raise ConnectionClosedError(f"connection to {self.peer_addr} is closed")
        data = cmd if isinstance(cmd, bytes) else encode(cmd)
        if self._corked or self._out:
            self._out.append(data)
            self._out_bytes += len(data)
            if self._out_bytes > MAX_COLLECTED_BYTES:
                self._write_out()
            return
        if self._wrote_since_read:
            # a second frame before the next read: collect, and write what is collected once this iteration
            self._out.append(data)
            self._out_bytes += len(data)
            if not self._flush_scheduled:
                self._flush_scheduled = True
                (self._loop or asyncio.get_running_loop()).call_soon(self._flush_out)
            return
        transport.write(data)
        self._wrote_since_read = True
        if self._write_paused:
            self._check_write_buffer()

    def _write_out(self) -> None:
        """Write the collected frames with one call (one syscall when the socket takes them)."""
        out = self._out
        self._out = []
        self._out_bytes = 0
        transport = self._transport
        if transport is None or self.closed:
            return
        if len(out) == 1:
            transport.write(out[0])
        else:
            transport.writelines(out)
        if self._write_paused:
            self._check_write_buffer()

    def _flush_out(self) -> None:
        self._flush_scheduled = False
        if self._out:
            self._write_out()

    async def drain(self) -> None:
        """Wait while the transport's write buffer is above its high-water mark."""
        if self._write_paused and not self.closed:
            fut = asyncio.get_running_loop().create_future()
            self._drain_waiters.append(fut)
            await fut

    def invoke_future(self, cmd: RemotingCommand) -> asyncio.Future[RemotingCommand]:
        """Send a request; the future resolves with the response (no timeout applied)."""
        return self.request(cmd, None)

    def request(self, cmd: RemotingCommand,
                timeout_ms: int | None = DEFAULT_TIMEOUT_MS) -> asyncio.Future[RemotingCommand]:
        """Send a request; the future resolves with the response, or fails with RemotingTimeoutError when no
        answer came within ``timeout_ms`` (``await conn.request(...)`` is ``await conn.invoke(...)`` without
        the coroutine; None: no timeout). Cancelling the future abandons the request."""
        # one call per request: the pending entry and the deadline timer are inline here
        if self.closed:
            raise ConnectionClosedError(f"connection to {self.peer_addr} is closed") from self.close_reason
        pending = self._pending
        if len(pending) >= MAX_PENDING_REQUESTS_PER_CONNECTION:
            raise RemotingTimeoutError("too many pending requests on one connection")
        loop = self._loop or asyncio.get_running_loop()
        cmd.opaque = opaque = next(self._opaque) & 0x7FFFFFFF
        cmd.flag &= ~1
        fut: asyncio.Future[RemotingCommand] = loop.create_future()
        if timeout_ms is None:
            pending[opaque] = (fut, None, cmd.code, 0)
        else:
            deadline = loop.time() + timeout_ms / 1000
            pending[opaque] = (fut, deadline, cmd.code, timeout_ms)
            timer = self._timer
            if timer is None:
                self._timer_at = deadline
                self._timer = loop.call_at(deadline, self._expire)
            elif deadline < self._timer_at:
                timer.cancel()
                self._timer_at = deadline
                self._timer = loop.call_at(deadline, self._expire)
        try:
            self.send(cmd)
        except BaseException:
            pending.pop(opaque, None)
            raise
        return fut

    def _expire(self) -> None:
        """The deadline timer: fail the requests whose time is up, drop abandoned ones, re-arm."""
        self._timer = None
        loop = self._loop
        if self.closed or loop is None:
            return
        # a timer may run up to a clock tick early; count deadlines within 1 ms as reached
        now = loop.time() + 0.001
        earliest: float | None = None
        expired: list[tuple[int, asyncio.Future[RemotingCommand], int, int]] = []
        for opaque, (fut, deadline, code, timeout_ms) in self._pending.items():
            if deadline is None:
                continue
            if fut.done():
                expired.append((opaque, fut, code, timeout_ms))
            elif deadline <= now:
                expired.append((opaque, fut, code, timeout_ms))
            elif earliest is None or deadline < earliest:
                earliest = deadline
        for opaque, fut, code, timeout_ms in expired:
            del self._pending[opaque]
            if not fut.done():
                exc = RemotingTimeoutError(f"no answer from {self.peer_addr} to code {code} within {timeout_ms} ms")
                exc.__suppress_context__ = True
                fut.set_exception(exc)
        if earliest is not None:
            self._timer_at = earliest
            self._timer = loop.call_at(earliest, self._expire)

    async def invoke(self, cmd: RemotingCommand, timeout_ms: int = DEFAULT_TIMEOUT_MS) -> RemotingCommand:
        fut = self.request(cmd, timeout_ms)
        opaque = cmd.opaque
        try:
            return await fut
        except asyncio.CancelledError:
            self._pending.pop(opaque, None)
            raise

    def invoke_oneway(self, cmd: RemotingCommand) -> None:
        cmd.opaque = next(self._opaque) & 0x7FFFFFFF
        cmd.flag |= 2
        self.send(cmd)

    # ---- lifecycle ---------------------------------------------------------------
    def close(self, reason: BaseException | None = None) -> None:
        if self._out and not self.closed:
            try:
                self._write_out()  # what was sent before close() leaves before the FIN
            except Exception as exc:  # noqa: BLE001 - closing anyway
                log.debug("pending frames to %s not written at close: %s", self.peer_addr, exc)
        if self._transport is not None and not self._transport.is_closing():
            self._transport.close()
        self._teardown(reason or ConnectionClosedError(f"connection to {self.peer_addr} closed locally"))

    def abort(self) -> None:
        if self._transport is not None:
            self._transport.abort()
        self._teardown(ConnectionClosedError(f"connection to {self.peer_addr} aborted"))

    def _teardown(self, reason: BaseException) -> None:
        if self.closed:
            return
        self.closed = True
        self.close_reason = reason
        self._out = []
        self._out_bytes = 0
        budget = self._budget
        if budget is not None:
            budget.partial_bytes -= self._partial_bytes
            self._partial_bytes = 0
            ip = self._admitted_ip
            if ip is not None:
                self._admitted_ip = None
                budget.connections -= 1
                left = budget.per_address.get(ip, 1) - 1
                if left > 0:
                    budget.per_address[ip] = left
                else:
                    budget.per_address.pop(ip, None)
        pending, self._pending = self._pending, {}
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for fut, _, _, _ in pending.values():
            if not fut.done():
                err = ConnectionClosedError(f"connection to {self.peer_addr} closed: {reason}")
                err.__cause__ = reason
                fut.set_exception(err)
        for w in self._drain_waiters:
            if not w.done():
                w.set_result(None)
        self._drain_waiters = []
        if self._closed_fut is not None and not self._closed_fut.done():
            self._closed_fut.set_result(None)
        if self._on_close is not None:
            try:
                self._on_close(self)
            except Exception:
                log.exception("on_close callback failed")

    async def wait_closed(self) -> None:
        if self._closed_fut is not None:
            await self._closed_fut


async def connect(
    addr: str,
    dispatcher: Dispatcher | None = None,
    *,
    timeout_ms: int = CONNECT_TIMEOUT_MS,
    on_close: Callable[[Connection], None] | None = None,
    ssl_context: ssl.SSLContext | None = None,
) -> Connection:
    """Open a connection to ``"host:port"``, with TLS when ``ssl_context`` is given or the process has a default
    client context (common/tls.py)."""
    host, port = split_addr(addr)
    loop = asyncio.get_running_loop()
    ctx = ssl_context or tls.default_client_context()
    try:
        _, proto = await aio.wait_for(
            loop.create_connection(lambda: Connection(dispatcher, on_close=on_close), host, port, ssl=ctx,
                                   server_hostname=tls.server_hostname(ctx, host)),
            timeout_ms / 1000,
        )
    except (TimeoutError, OSError) as exc:  # ssl.SSLError is an OSError
        raise ConnectError(f"cannot connect to {addr}: {exc or 'timeout'}") from exc
    return proto


def split_addr(addr: str) -> tuple[str, int]:
    host, _, port = addr.strip().rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"address must be host:port, got {addr!r}")
    return host, int(port)
