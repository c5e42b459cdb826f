"""A minimal Prometheus scrape endpoint on the process's asyncio loop (``GET /metrics`` →
``prometheus_client.generate_latest``), used by the broker (``metricsPort``) and the name server
(``--metrics-port``).

Why not ``prometheus_client.start_http_server``: it serves from a thread, and the collectors would then read
the broker's tables (plain dicts mutated by the event loop) from that thread. Here the collectors run on the
loop thread that owns the state: no locks, no "dict changed size during iteration", no extra thread. A
scrape costs the loop the time to render the text (well under a millisecond for a few hundred series); text
whose size grows with the estate comes from ``extra``, a coroutine that builds it in slices yielding the loop
(the broker's per-topic series), and is written piece by piece.

Requests are bounded: the request head must arrive within ``METRICS_READ_TIMEOUT_S`` and fit in
``METRICS_MAX_HEAD_BYTES``; other paths get 404; one request per connection (HTTP/1.0, then closed). With
credentials (``common.http_auth.HttpAuth``) a scrape without the right ``Authorization`` header gets 401.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from ferrymq.common import aio
from ferrymq.common.http_auth import HttpAuth

log = logging.getLogger(__name__)

METRICS_PATH = "/metrics"
#: a scrape's request head must arrive within this time and size
METRICS_READ_TIMEOUT_S = 5.0
METRICS_MAX_HEAD_BYTES = 8192


class MetricsServer:
    """``GET /metrics`` on ``host:port`` (port 0 = any free port; ``port`` holds the bound one)."""

    def __init__(self, registry: CollectorRegistry, host: str, port: int, auth: HttpAuth | None = None,
                 extra: Callable[[], Awaitable[list[bytes]]] | None = None) -> None:
        self.registry = registry
        #: more exposition text after the registry's, built by a coroutine in pieces (the broker's per-topic
        #: series), written piece by piece
        self.extra = extra
        self.host = host
        self.port = port
        self.auth = auth or HttpAuth()
        self._server: asyncio.AbstractServer | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, self.host, self.port, limit=METRICS_MAX_HEAD_BYTES)
        self.port = self._server.sockets[0].getsockname()[1]
        log.info("metrics on http://%s:%d%s", self.host, self.port, METRICS_PATH)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            try:
                head = await aio.wait_for(reader.readuntil(b"\r\n\r\n"), METRICS_READ_TIMEOUT_S)
            except asyncio.LimitOverrunError:
                head = b""
            except (asyncio.IncompleteReadError, TimeoutError, ConnectionError):
                return
            parts = head.split(b"\r\n", 1)[0].split()
            path = parts[1].split(b"?", 1)[0] if len(parts) >= 2 else b""
            extra = ""
            more: list[bytes] = []
            if not head:
                status, body, ctype = "400 Bad Request", b"request head too large\n", "text/plain"
            elif not self.auth.allows(_header(head, b"authorization")):
                status, body, ctype = "401 Unauthorized", b"credentials required\n", "text/plain"
                extra = f"WWW-Authenticate: {self.auth.challenge()}\r\n"
            elif len(parts) >= 2 and parts[0] == b"GET" and path.decode("latin-1") == METRICS_PATH:
                body = generate_latest(self.registry)
                if self.extra is not None:
                    more = await self.extra()
                status, ctype = "200 OK", CONTENT_TYPE_LATEST
            else:
                status, body, ctype = "404 Not Found", f"try GET {METRICS_PATH}\n".encode(), "text/plain"
            length = len(body) + sum(len(piece) for piece in more)
            writer.write(f"HTTP/1.0 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {length}\r\n{extra}"
                         "Connection: close\r\n\r\n".encode("latin-1") + body)
            for piece in more:
                writer.write(piece)
                await writer.drain()
            await writer.drain()
        except ConnectionError:
            pass
        except Exception:
            log.exception("metrics request failed")
        finally:
            writer.close()


def _header(head: bytes, name: bytes) -> bytes | None:
    """The value of header ``name`` (lower case) in a request head, None if absent."""
    for line in head.split(b"\r\n")[1:]:
        key, sep, value = line.partition(b":")
        if sep and key.strip().lower() == name:
            return value.strip()
    return None
