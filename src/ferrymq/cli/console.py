"""``ferry console``: the read-only web console (docs/console.md) for the cluster of a name server."""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import Callable

import click

from ferrymq.cli.namesrv import parse_listen
from ferrymq.client._cli import namesrv_option
from ferrymq.common.http_auth import HttpAuth, check_basic, check_token, is_loopback

DEFAULT_LISTEN = "127.0.0.1:8080"
#: environment variables of the credentials (keeps them out of the process list)
TOKEN_ENV = "FERRYMQ_CONSOLE_AUTH_TOKEN"
BASIC_ENV = "FERRYMQ_CONSOLE_BASIC_AUTH"


async def _serve(namesrv: str, host: str, port: int, sample_interval_s: float, auth: HttpAuth) -> None:
    from ferrymq.client import Admin
    from ferrymq.console.app import serve

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with Admin(namesrv) as admin:
        runner, bound = await serve(admin, host, port, sample_interval_s=sample_interval_s, auth=auth)
        try:
            access = "credentials required" if auth.required else "no credentials"
            click.echo(f"ferrymq console on http://{host}:{bound}/ (name server {namesrv}; {access})", err=True)
            await stop.wait()
        finally:
            await runner.cleanup()


def _credential(check: Callable[[str], str]) -> Callable[[click.Context, click.Parameter, str | None], str]:
    def callback(_ctx: click.Context, param: click.Parameter, value: str | None) -> str:
        try:
            return check(value) if value else ""
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint=f"--{(param.name or '').replace('_', '-')}") from None
    return callback


@click.command("console")
@namesrv_option
@click.option("--listen", default=DEFAULT_LISTEN, show_default=True,
              help="host:port to serve on (port 0 = any); another host than 127.0.0.1 shows topic and group "
                   "names to whoever reaches it: set --auth-token or --basic-auth")
@click.option("--sample-interval", "sample_interval_s", default=5.0, show_default=True,
              type=click.FloatRange(0.2, 3600), help="Seconds between the samples drawn in the charts")
@click.option("--auth-token", envvar=TOKEN_ENV, default=None, callback=_credential(check_token),
              help=f"Require 'Authorization: Bearer TOKEN' (or ${TOKEN_ENV}; the variable keeps it out of ps)")
@click.option("--basic-auth", envvar=BASIC_ENV, default=None, callback=_credential(check_basic),
              metavar="USER:PASSWORD", help=f"Require HTTP basic auth, what browsers prompt for (or ${BASIC_ENV})")
def command(namesrv: str, listen: str, sample_interval_s: float, auth_token: str, basic_auth: str) -> None:
    """Serve the read-only web console (cluster, topics, groups, messages, charts) until SIGINT/SIGTERM."""
    try:
        host, port = parse_listen(listen)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--listen") from None
    auth = HttpAuth(token=auth_token, basic=basic_auth)
    if not auth.required and not is_loopback(host):
        click.echo(f"Warning: the console on {listen} has no --auth-token or --basic-auth: whoever reaches it "
                   "reads topic and group names", err=True)
    try:
        asyncio.run(_serve(namesrv, host, port, sample_interval_s, auth))
    except OSError as exc:
        click.echo(f"Error: cannot serve the console on {listen}: {exc}", err=True)
        sys.exit(1)
