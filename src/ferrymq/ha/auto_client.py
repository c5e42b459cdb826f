"""Slave side of controller-mode HA (wire: ``auto_codec``).

A session: connect to the master's HA address, read its hello, send the handshake (identity, epoch entries,
max phy offset, HMAC over the nonce when ``ha_secret`` is set), read the answer, cut the store at the
answered common point (``store.truncate_to`` then ``epoch_file.truncate_after``), report the new max phy
offset, then append every transfer at exactly its phy offset and report after each one.

Refused (the session ends, the next one starts after ``reconnect_interval_ms``): an answer that is not OK,
an answer or a transfer whose master epoch is older than the known master epoch (``set_master``), a transfer
whose data epoch is older than the newest local entry, or one that does not start at the local max phy
offset. A transfer of a newer data epoch adds (data_epoch, epoch_start) to the epoch file before its bytes
are appended. ``on_appended()`` (the broker's reput) runs after each appended transfer.

The handshake runs on streams; the copy that follows runs in ``_TransferProtocol`` callbacks on the same
transport (``transport.set_protocol``): every complete transfer of a receive is appended inside
``data_received`` and one report with the new max phy offset answers the receive, with no task wake-up
and no per-read timer on the replication path. Silence for ``read_timeout_ms`` ends the session (checked
every quarter of it).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections.abc import Callable
from typing import Any

from ferrymq.common import aio, tls
from ferrymq.common.aio import wait_event
from ferrymq.errors import ProtocolError
from ferrymq.ha import auto_codec as codec
from ferrymq.ha.epoch import EpochFile

__all__ = ["AutoSwitchHAClient", "StaleEpochError"]

log = logging.getLogger(__name__)

DEFAULT_RECONNECT_INTERVAL_MS = 1000
CONNECT_TIMEOUT_MS = 3000
#: the master sends a heartbeat every second when idle; nothing for this long ends the session
DEFAULT_READ_TIMEOUT_MS = 20_000


def _buffered(reader: asyncio.StreamReader) -> int:
    """Bytes the stream reader already holds (0 when the implementation does not say)."""
    buffer = getattr(reader, "_buffer", None)
    return len(buffer) if buffer is not None else 0


class StaleEpochError(ProtocolError):
    """The master (or a transfer) speaks for an epoch older than the one this replica knows."""


class AutoSwitchHAClient:
    def __init__(self, store: Any, epoch_file: EpochFile, replica_id: int, broker_name: str, *,
                 ha_secret: str | None = None, on_appended: Callable[[], Any] | None = None,
                 reconnect_interval_ms: int = DEFAULT_RECONNECT_INTERVAL_MS,
                 read_timeout_ms: int = DEFAULT_READ_TIMEOUT_MS,
                 ssl_context: ssl.SSLContext | None = None) -> None:
        #: TLS to the master's HA port (tlsEnable and tls.client.*, common/tls.py)
        self.ssl_context = ssl_context
        self.store = store
        self.epoch_file = epoch_file
        self.replica_id = replica_id
        self.broker_name = broker_name
        self.secret = ha_secret.encode() if ha_secret else None
        self.on_appended = on_appended
        self.reconnect_interval_ms = reconnect_interval_ms
        self.read_timeout_ms = read_timeout_ms
        self.master_addr: str | None = None
        self.master_epoch = 0
        self.confirm_offset = 0
        self.connected = False
        self.last_error = ""
        self.truncations = 0
        self.refused_transfers = 0
        self._task: asyncio.Task[None] | None = None
        self._session: asyncio.Task[None] | None = None
        self._changed = asyncio.Event()

    # --- API -------------------------------------------------------------------------------------

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    def set_master(self, ha_addr: str | None, master_epoch: int) -> None:
        """Follow this master (None: follow none). A change of address or epoch restarts the session."""
        if ha_addr == self.master_addr and master_epoch == self.master_epoch:
            return
        if master_epoch < self.master_epoch:
            log.warning("ignoring master %s of epoch %d: epoch %d is known", ha_addr, master_epoch, self.master_epoch)
            return
        self.master_addr = ha_addr
        self.master_epoch = master_epoch
        self._changed.set()
        if self._session is not None:
            self._session.cancel()

    def status(self) -> dict[str, Any]:
        return {"masterAddr": self.master_addr, "masterEpoch": self.master_epoch, "connected": self.connected,
                "maxPhyOffset": int(self.store.max_phy_offset), "confirmOffset": self.confirm_offset,
                "epoch": self.epoch_file.last_epoch(), "truncations": self.truncations,
                "refusedTransfers": self.refused_transfers, "lastError": self.last_error}

    # --- sessions --------------------------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            if self.master_addr is None:
                self._changed.clear()
                await self._changed.wait()
                continue
            self._changed.clear()
            self._session = asyncio.create_task(self._one_session(self.master_addr))
            try:
                await self._session
            except asyncio.CancelledError:
                current = asyncio.current_task()
                if self._task is None or (current is not None and current.cancelling()):
                    raise
            except (TimeoutError, ProtocolError, OSError, asyncio.IncompleteReadError) as exc:
                self.last_error = f"{type(exc).__name__}: {exc}"
                log.warning("HA session with %s ended: %s", self.master_addr, self.last_error)
            finally:
                self.connected = False
                self._session = None
            if self._changed.is_set():
                continue
            await wait_event(self._changed, self.reconnect_interval_ms / 1000)

    async def _one_session(self, addr: str) -> None:
        host, _, port = addr.rpartition(":")
        reader, writer = await aio.wait_for(asyncio.open_connection(
            host, int(port), ssl=self.ssl_context, server_hostname=tls.server_hostname(self.ssl_context, host)), CONNECT_TIMEOUT_MS / 1000)
        try:
            await self._handshake(reader, writer)
            self.connected = True
            await self._copy(reader, writer)
        finally:
            writer.close()

    async def _read(self, reader: asyncio.StreamReader, n: int) -> bytes:
        if _buffered(reader) >= n:  # already here: no timer, no suspension
            return await reader.readexactly(n)
        async with asyncio.timeout(self.read_timeout_ms / 1000):
            return await reader.readexactly(n)

    async def _handshake(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonce = codec.decode_hello(await self._read(reader, codec.HELLO_SIZE))
        store = self.store
        local_max = int(store.max_phy_offset)
        # entries beyond the log (a crash between a cut and the epoch file's) are not the log's
        self.epoch_file.truncate_after(local_max + 1)
        writer.write(codec.encode_handshake(self.replica_id, self.broker_name, local_max, self.epoch_file.entries(),
                                            self.secret, nonce))
        fixed = await self._read(reader, codec.ANSWER_FIXED)
        answer = codec.decode_answer(fixed + await self._read(reader, codec.answer_rest_size(fixed)))
        if answer.status is not codec.HandshakeStatus.OK:
            raise ProtocolError(f"master refused the handshake: {answer.status.name}")
        if answer.master_epoch < self.master_epoch:
            raise StaleEpochError(f"master answers for epoch {answer.master_epoch}, epoch {self.master_epoch} is known")
        self.master_epoch = answer.master_epoch
        cut = answer.truncate_to
        if cut < 0 or cut > local_max:
            raise ProtocolError(f"master answered truncation point {cut} (local max {local_max})")
        if cut < local_max:
            log.warning("HA: cutting the diverged log tail [%d, %d) (common point with the master of epoch %d)",
                        cut, local_max, answer.master_epoch)
            store.truncate_to(cut)
            self.truncations += 1
        self.epoch_file.truncate_after(cut if cut > 0 else 0)
        if cut > 0 and not self.epoch_file.entries():
            raise ProtocolError("common point without a common epoch entry")
        writer.write(codec.encode_report(int(store.max_phy_offset)))
        await writer.drain()

    async def _copy(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Hand the transport to a ``_TransferProtocol`` and wait for the session's end."""
        transport: Any = writer.transport
        proto = _TransferProtocol(self, transport)
        leftover = bytes(getattr(reader, "_buffer", b""))  # sent right after the handshake, already read
        transport.set_protocol(proto)
        if not transport.is_reading():  # the stream reader paused it on a full buffer: nobody else resumes it
            transport.resume_reading()
        if leftover:
            proto.data_received(leftover)
        if reader.at_eof():
            proto.connection_lost(None)
        timeout_s = self.read_timeout_ms / 1000
        while True:
            await asyncio.wait((proto.done,), timeout=timeout_s / 4)
            if proto.done.done():
                error = proto.done.result()
                if error is not None:
                    raise error
                raise ConnectionError("the master closed the HA connection")
            if time.monotonic() - proto.last_received_s > timeout_s:
                raise TimeoutError(f"nothing from the master for {self.read_timeout_ms} ms")

    def _on_transfer(self, header: codec.TransferHeader, body: bytes) -> bool:
        """Apply one transfer (checks, epoch entry, append); True when bytes were appended."""
        if header.master_epoch < self.master_epoch:
            self.refused_transfers += 1
            raise StaleEpochError(f"transfer of master epoch {header.master_epoch}; epoch {self.master_epoch} "
                                  "is known")
        self.master_epoch = header.master_epoch
        self.confirm_offset = header.confirm_offset
        if not header.body_size:
            return False  # a heartbeat: answered with a report all the same
        epoch_file = self.epoch_file
        store = self.store
        last = epoch_file.last_entry()
        if last is None or header.data_epoch > last.epoch:
            if last is not None and header.epoch_start < last.start_phy_offset:
                raise ProtocolError(f"epoch {header.data_epoch} starts at {header.epoch_start}, before "
                                    f"epoch {last.epoch}")
            epoch_file.append(header.data_epoch, header.epoch_start)
        elif header.data_epoch < last.epoch:
            self.refused_transfers += 1
            raise StaleEpochError(f"transfer of data epoch {header.data_epoch} after epoch {last.epoch}")
        local_max = int(store.max_phy_offset)
        if header.phy_offset != local_max and local_max != 0:
            raise ProtocolError(f"transfer at {header.phy_offset}, local max {local_max}")
        if not store.append_at(header.phy_offset, body):
            raise ProtocolError(f"append at {header.phy_offset} refused by the store")
        return True


class _TransferProtocol(asyncio.Protocol):
    """The copy phase of one session: transfers in, reports out (see the module docstring). ``done`` gets
    the error that ended the session (None: the master closed it)."""

    def __init__(self, client: AutoSwitchHAClient, transport: asyncio.BaseTransport) -> None:
        self.client = client
        self.transport: Any = transport
        self.buffer = bytearray()
        self.done: asyncio.Future[BaseException | None] = asyncio.get_running_loop().create_future()
        self.last_received_s = time.monotonic()

    def data_received(self, data: bytes) -> None:
        if self.done.done():
            return
        self.last_received_s = time.monotonic()
        buffer = self.buffer
        buffer += data
        client = self.client
        head = codec.TRANSFER_HEADER_SIZE
        pos, end, answered, appended = 0, len(buffer), False, False
        confirm_before = client.confirm_offset
        try:
            while end - pos >= head:
                header = codec.decode_transfer_header(bytes(buffer[pos:pos + head]))
                if end - pos - head < header.body_size:
                    break
                body = bytes(memoryview(buffer)[pos + head:pos + head + header.body_size])  # (view freed at once)
                pos += head + header.body_size
                appended = client._on_transfer(header, body) or appended
                answered = True
        except (ProtocolError, OSError, ValueError) as exc:
            self._end(exc)
            return
        finally:
            if pos:
                del buffer[:pos]
        if answered:  # one report per receive: the new max (an idle master's heartbeat gets one too)
            self.transport.write(codec.encode_report(int(client.store.max_phy_offset)))
        if (appended or client.confirm_offset != confirm_before) and client.on_appended is not None:
            result = client.on_appended()
            if asyncio.iscoroutine(result):
                asyncio.ensure_future(result)

    def _end(self, error: BaseException | None) -> None:
        if not self.done.done():
            self.done.set_result(error)
        self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_result(exc)

    def eof_received(self) -> bool:
        return False
