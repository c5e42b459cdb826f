"""``ferry console``: the web console (docs/console.md) for the cluster of a name server; read-only unless a
users file gives accounts to log in with (``ferry console hash-password`` writes its entries)."""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

import click

from ferrymq.cli.namesrv import parse_listen
from ferrymq.client._cli import namesrv_option
from ferrymq.common.http_auth import HttpAuth, check_basic, check_token, is_loopback

if TYPE_CHECKING:
    from ferrymq.console.auth import User

DEFAULT_LISTEN = "127.0.0.1:8080"
#: environment variables of the credentials (keeps them out of the process list)
TOKEN_ENV = "FERRYMQ_CONSOLE_AUTH_TOKEN"
BASIC_ENV = "FERRYMQ_CONSOLE_BASIC_AUTH"
USERS_FILE_ENV = "FERRYMQ_CONSOLE_USERS_FILE"
CONTROLLER_ENV = "CONTROLLER_ADDR"
#: exit code of a usage error (click's)
EXIT_USAGE = 2


async def _serve(namesrv: str, host: str, port: int, sample_interval_s: float, auth: HttpAuth,
                 users: dict[str, User], controller: str, secure_cookie: bool) -> None:
    from ferrymq.client import Admin
    from ferrymq.console.app import serve

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with Admin(namesrv) as admin:
        runner, bound = await serve(admin, host, port, sample_interval_s=sample_interval_s, auth=auth,
                                    users=users, controller_addrs=controller, secure_cookie=secure_cookie)
        try:
            access = "credentials required" if auth.required else "no credentials"
            if users:
                admins = sum(1 for u in users.values() if u.role.can_act)
                access = f"log-in required, {len(users)} account(s), {admins} admin(s)" + (
                    "; header credentials read" if auth.required else "")
            else:
                access += "; read-only (no --users-file)"
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


@click.group("console", invoke_without_command=True)
@namesrv_option
@click.option("--listen", default=DEFAULT_LISTEN, show_default=True,
              help="host:port to serve on (port 0 = any); another host than 127.0.0.1 shows topic and group "
                   "names to whoever reaches it: set --users-file, --auth-token or --basic-auth")
@click.option("--sample-interval", "sample_interval_s", default=5.0, show_default=True,
              type=click.FloatRange(0.2, 3600), help="Seconds between the samples drawn in the charts")
@click.option("--auth-token", envvar=TOKEN_ENV, default=None, callback=_credential(check_token),
              help=f"Require 'Authorization: Bearer TOKEN' (or ${TOKEN_ENV}; the variable keeps it out of ps)")
@click.option("--basic-auth", envvar=BASIC_ENV, default=None, callback=_credential(check_basic),
              metavar="USER:PASSWORD", help=f"Require HTTP basic auth, what browsers prompt for (or ${BASIC_ENV})")
@click.option("--users-file", envvar=USERS_FILE_ENV, default=None, type=click.Path(dir_okay=False),
              help="YAML accounts (admin / read-only) to log in with; admins can act on the cluster. Without it "
                   "the console is read-only. Entries: ferry console hash-password")
@click.option("--controller", envvar=CONTROLLER_ENV, default="",
              help="Controller address(es), ';'-separated, for the HA page and elect (controller mode; found "
                   "from the brokers' controllerAddr when not given)")
@click.option("--secure-cookie", is_flag=True,
              help="Mark the session cookie Secure (the console is reached over HTTPS through a proxy)")
@click.pass_context
def command(ctx: click.Context, namesrv: str, listen: str, sample_interval_s: float, auth_token: str,
            basic_auth: str, users_file: str | None, controller: str, secure_cookie: bool) -> None:
    """Serve the web console (overview, cluster, topics, groups, messages, producers, HA; actions for logged-in
    admins) until SIGINT/SIGTERM."""
    if ctx.invoked_subcommand is not None:
        return
    from ferrymq.console.auth import load_users

    users: dict[str, User] = {}
    if users_file:
        try:
            users = load_users(users_file)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--users-file") from None
    try:
        host, port = parse_listen(listen)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--listen") from None
    auth = HttpAuth(token=auth_token, basic=basic_auth)
    if not auth.required and not users and not is_loopback(host):
        click.echo(f"Warning: the console on {listen} has no --users-file, --auth-token or --basic-auth: whoever "
                   "reaches it reads topic and group names", err=True)
    try:
        asyncio.run(_serve(namesrv, host, port, sample_interval_s, auth, users, controller, secure_cookie))
    except OSError as exc:
        click.echo(f"Error: cannot serve the console on {listen}: {exc}", err=True)
        sys.exit(1)


@command.command("hash-password")
@click.option("-u", "--user", "user", required=True, help="user name of the account")
@click.option("--role", type=click.Choice(["admin", "read-only"]), default="read-only", show_default=True,
              help="admin: sees and acts; read-only: sees")
@click.option("--password-stdin", is_flag=True, help="read the password from the first line of stdin "
              "instead of prompting (for scripts)")
def hash_password_command(user: str, role: str, password_stdin: bool) -> None:
    """Print a users-file entry (scrypt hash with a fresh salt) for an account: paste it under `users:`."""
    from ferrymq.console.auth import Role, check_user_name, hash_password, users_file_entry

    try:
        check_user_name(user)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--user") from None
    if password_stdin:
        password = sys.stdin.readline().rstrip("\r\n")
    else:
        password = click.prompt("Password", hide_input=True, confirmation_prompt=True)
    if not password:
        raise click.BadParameter("the password is empty", param_hint="--password-stdin")
    click.echo(users_file_entry(user, Role(role), hash_password(password)))
