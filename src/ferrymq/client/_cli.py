"""Shared bits of the client CLI verbs (``ferry topic|cluster|consumer|message|produce|consume``):
running a coroutine, one-line errors with a non-zero exit, rich tables or JSON."""

from __future__ import annotations

import asyncio
import functools
import json
import os
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, TypeVar

import click

from ferrymq.errors import FerryError

T = TypeVar("T")

NAMESRV_ENV = "NAMESRV_ADDR"


#: the largest TCP port number
MAX_PORT = 65535


def check_addr(addr: str) -> str | None:
    """Why ``addr`` is not a ``host:port`` address, or None when it is one."""
    host, _, port = addr.strip().rpartition(":")
    if not host:
        return f"{addr!r} is not host:port"
    if not port.isdigit() or not 0 < int(port) <= MAX_PORT:
        return f"{addr!r}: the port must be a number from 1 to {MAX_PORT}"
    return None


def addr_list_param(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """Click callback: a ``;``-separated list of ``host:port`` addresses, refused as a usage error (exit 2)."""
    if value is None:
        return None
    addrs = [a for a in value.split(";") if a.strip()]
    if not addrs:
        raise click.BadParameter("no address given (expected host:port[;host:port...])", ctx, param)
    for a in addrs:
        reason = check_addr(a)
        if reason:
            raise click.BadParameter(reason, ctx, param)
    return value


def addr_param(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """Click callback: one ``host:port`` address (a broker's), refused as a usage error (exit 2)."""
    if value is None:
        return None
    reason = check_addr(value)
    if reason:
        raise click.BadParameter(reason, ctx, param)
    return value


def namesrv_option(f: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("-n", "--namesrv", "namesrv", envvar=NAMESRV_ENV, default="127.0.0.1:9876",
                        show_default=True, callback=addr_list_param,
                        help="Name server address(es), ';'-separated (env NAMESRV_ADDR)")(f)


def json_option(f: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table")(f)


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro``; any ferrymq/OS error becomes a one-line message and exit code 1."""
    try:
        return asyncio.run(coro)
    except (FerryError, OSError, ValueError) as exc:
        raise click.ClickException(f"{type(exc).__name__}: {exc}") from None


def handle_errors(f: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(f)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return f(*args, **kwargs)
        except (FerryError, OSError, ValueError) as exc:
            raise click.ClickException(f"{type(exc).__name__}: {exc}") from None
    return wrapper


def emit(rows: Sequence[dict[str, Any]], columns: Sequence[str], *, as_json: bool, title: str | None = None) -> None:
    if as_json:
        click.echo(json.dumps(list(rows), default=str, ensure_ascii=False))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for col in columns:
        table.add_column(col)
    for row in rows:
        table.add_row(*(table_cell(row.get(c, "")) for c in columns))
    Console(width=int(os.environ.get("COLUMNS", "160"))).print(table)


def table_cell(value: Any) -> str:
    """A value as table text: a map as ``key=value`` pairs, a list comma-separated (never a Python repr)."""
    if isinstance(value, dict):
        return " ".join(f"{k}={table_cell(v)}" for k, v in value.items())
    if isinstance(value, (list, tuple, set)):
        return ", ".join(table_cell(v) for v in value)
    return str(value)


def message_row(m: Any) -> dict[str, Any]:
    return {
        "topic": m.topic, "queueId": m.queue_id, "queueOffset": m.queue_offset, "msgId": m.msg_id,
        "offsetMsgId": m.offset_msg_id, "tags": m.tags or "", "keys": " ".join(m.keys),
        "reconsumeTimes": m.reconsume_times, "bornTimestamp": m.born_timestamp,
        "storeTimestamp": m.store_timestamp, "properties": dict(m.properties),
        "body": m.body.decode("utf-8", "replace"),
    }
