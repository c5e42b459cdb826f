"""``ferry namesrv --listen 127.0.0.1:9876``: run a name server in the foreground until SIGINT/SIGTERM.

Exit codes: 0 after a signal, 1 when the server cannot start (e.g. address in use), 2 on a bad option.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys

import click

from ferrymq.common import logthrottle
from ferrymq.errors import ConfigError

DEFAULT_LISTEN = "127.0.0.1:9876"
EXIT_START_FAILED = 1
EXIT_USAGE = 2
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def parse_listen(value: str) -> tuple[str, int]:
    """``host:port`` (IPv6 as ``[::1]:9876``) -> (host, port); ValueError with a one-line reason."""
    host, sep, port_s = value.strip().rpartition(":")
    if not sep or not host or not port_s.isdigit():
        raise ValueError(f"expected host:port, got {value!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    port = int(port_s)
    if not 0 <= port <= 65535:
        raise ValueError(f"port {port} out of range 0-65535")
    if not host or any(c.isspace() for c in host):
        raise ValueError(f"bad host in {value!r}")
    return host, port


async def _serve(host: str, port: int, kv_config_path: str | None, metrics_port: int) -> None:
    from ferrymq.namesrv.app import NameServer

    server = NameServer(host, port, kv_config_path=kv_config_path, metrics_port=metrics_port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    # handlers first: the "listening" line may be acted on (a signal sent) at once
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await server.start()
        await stop.wait()
        logging.getLogger("ferrymq.namesrv").info("signal received, shutting down")
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        await server.stop()


def _run(host: str, port: int, kv_config_path: str | None, metrics_port: int) -> None:
    try:
        import uvloop
    except ImportError:
        asyncio.run(_serve(host, port, kv_config_path, metrics_port))
        return
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(_serve(host, port, kv_config_path, metrics_port))


@click.command("namesrv")
@click.option("--listen", default=DEFAULT_LISTEN, show_default=True, help="host:port to serve on (port 0 = any).")
@click.option("--kv-config", "kv_config_path", default=None, type=click.Path(dir_okay=False),
              help="File persisting the KV config table (default: memory only).")
@click.option("--metrics-port", type=click.IntRange(-1, 65535), default=-1, show_default=True,
              help="Prometheus endpoint (GET /metrics) on the --listen host; -1 = off, 0 = any free port.")
@click.option("--log-level", default="INFO", show_default=True,
              type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False))
def command(listen: str, kv_config_path: str | None, metrics_port: int, log_level: str) -> None:
    """Run a name server in the foreground (logs to stderr; SIGINT/SIGTERM stop it)."""
    try:
        host, port = parse_listen(listen)
    except ValueError as exc:
        click.echo(f"Error: invalid --listen: {exc}", err=True)
        sys.exit(EXIT_USAGE)
    logging.basicConfig(stream=sys.stderr, level=log_level.upper(), format=LOG_FORMAT)
    logthrottle.install()
    try:
        _run(host, port, kv_config_path, metrics_port)
    except ConfigError as exc:
        click.echo(f"Error: {exc}", err=True)
        sys.exit(EXIT_USAGE)
    except OSError as exc:
        click.echo(f"Error: cannot start name server on {listen}: {exc}", err=True)
        sys.exit(EXIT_START_FAILED)
