"""``ferry console``: the read-only web console (docs/console.md) for the cluster of a name server."""

from __future__ import annotations

import asyncio
import signal
import sys

import click

from ferrymq.cli.namesrv import parse_listen
from ferrymq.client._cli import namesrv_option

DEFAULT_LISTEN = "127.0.0.1:8080"


async def _serve(namesrv: str, host: str, port: int, sample_interval_s: float) -> None:
    from ferrymq.client import Admin
    from ferrymq.console.app import serve

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with Admin(namesrv) as admin:
        runner, bound = await serve(admin, host, port, sample_interval_s=sample_interval_s)
        try:
            click.echo(f"ferrymq console on http://{host}:{bound}/ (name server {namesrv})", err=True)
            await stop.wait()
        finally:
            await runner.cleanup()


@click.command("console")
@namesrv_option
@click.option("--listen", default=DEFAULT_LISTEN, show_default=True, help="host:port to serve on (port 0 = any)")
@click.option("--sample-interval", "sample_interval_s", default=5.0, show_default=True,
              type=click.FloatRange(0.2, 3600), help="Seconds between the samples drawn in the charts")
def command(namesrv: str, listen: str, sample_interval_s: float) -> None:
    """Serve the read-only web console (cluster, topics, groups, messages, charts) until SIGINT/SIGTERM."""
    try:
        host, port = parse_listen(listen)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--listen") from None
    try:
        asyncio.run(_serve(namesrv, host, port, sample_interval_s))
    except OSError as exc:
        click.echo(f"Error: cannot serve the console on {listen}: {exc}", err=True)
        sys.exit(1)
