"""``ferry proxy -n NAMESRV --listen 127.0.0.1:8081``: serve RocketMQ 5 clients over gRPC (cluster mode).

The proxy finds the brokers through the name servers and translates ``apache.rocketmq.v2`` calls onto the
4.x remoting protocol (docs/grpc.md)."""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any

import click

from ferrymq.cli.broker import EXIT_CONFIG_ERROR, LOG_LEVELS, event_loop_factory, wait_for_signal
from ferrymq.common import logthrottle
from ferrymq.errors import ConfigError, FerryError


def _tls_of(path: str) -> tuple[Any, Any]:
    """(server, client) TLS settings of a ``--tls-config`` properties file (relative paths from its folder)."""
    if not path:
        return None, None
    from ferrymq.common import tls
    from ferrymq.common.properties import parse_properties, read_config_text

    props = parse_properties(read_config_text(path, "--tls-config"))
    base_dir = os.path.dirname(os.path.abspath(path))
    return tls.server_settings(props, base_dir), tls.client_settings(props, base_dir)


def parse_listen(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise click.UsageError(f"--listen: expected HOST:PORT, got {text!r}")
    return host.strip("[]"), int(port)


async def _run(config: object) -> None:
    from ferrymq.proxy.server import ProxyServer

    server = ProxyServer(config)  # type: ignore[arg-type]
    await server.start()
    try:
        click.echo(f"ferrymq gRPC proxy serving on {server.config.listen_host}:{server.port} "
                   f"(name servers {server.config.namesrv_addr})")
        sys.stdout.flush()
        await wait_for_signal()
    finally:
        await server.stop()


@click.command("proxy")
@click.option("-n", "--namesrv", required=True, help='name servers, e.g. "127.0.0.1:9876;127.0.0.1:9877"')
@click.option("--listen", default="127.0.0.1:8081", show_default=True, help="HOST:PORT of the gRPC endpoint")
@click.option("--fifo-group", "fifo_groups", multiple=True,
              help="a consumer group consumed in FIFO order (repeatable)")
@click.option("--max-delivery-attempts", type=int, default=None,
              help="deliveries before a message moves to %DLQ%<group> (default 17)")
@click.option("--access-key", default="", help="ACL credentials of the proxy's calls to the brokers")
@click.option("--secret-key", default="")
@click.option("--acl-file", default="", help="plain_acl.yml: check 5.x clients' signatures and rights against it")
@click.option("--tls-config", default="",
              help="properties file with the remoting TLS keys (tlsServerMode, tls.server.*: the gRPC port; "
                   "tlsEnable, tls.client.*: the proxy's calls to name servers and brokers)")
@click.option("--auto-renew-invisible-ms", type=int, default=None,
              help="invisible time of a message a PushConsumer receives (auto_renew), renewed by the same step "
                   "while the client works on it (default 60000)")
@click.option("--renew-ahead-ms", type=int, default=None,
              help="renew an auto-renewed message this long before it would become visible (default 10000)")
@click.option("--renew-max-ms", type=int, default=None,
              help="renew an auto-renewed message for at most this long after its delivery (default 10800000: 3 h)")
@click.option("--log-level", default="INFO", show_default=True)
def command(namesrv: str, listen: str, fifo_groups: tuple[str, ...], max_delivery_attempts: int | None,
            access_key: str, secret_key: str, acl_file: str, tls_config: str, auto_renew_invisible_ms: int | None,
            renew_ahead_ms: int | None, renew_max_ms: int | None, log_level: str) -> None:
    """Serve RocketMQ 5 clients (gRPC, apache.rocketmq.v2) in front of the brokers the name servers know."""
    from ferrymq.proxy.config import (
        DEFAULT_AUTO_RENEW_INVISIBLE_MS,
        DEFAULT_MAX_DELIVERY_ATTEMPTS,
        DEFAULT_RENEW_AHEAD_MS,
        DEFAULT_RENEW_MAX_MS,
        ProxyConfig,
    )

    host, port = parse_listen(listen)
    if log_level.upper() not in LOG_LEVELS:
        raise click.UsageError(f"--log-level: expected one of {', '.join(LOG_LEVELS)}")
    logthrottle.configure_server_logging(log_level.upper())
    try:
        tls_server, tls_client = _tls_of(tls_config)
        config = ProxyConfig(namesrv, listen_host=host, listen_port=port, fifo_groups=frozenset(fifo_groups),
                             max_delivery_attempts=max_delivery_attempts or DEFAULT_MAX_DELIVERY_ATTEMPTS,
                             access_key=access_key, secret_key=secret_key, acl_path=acl_file,
                             tls_server=tls_server, tls=tls_client,
                             auto_renew_invisible_ms=(DEFAULT_AUTO_RENEW_INVISIBLE_MS if auto_renew_invisible_ms is None
                                                      else auto_renew_invisible_ms),
                             renew_ahead_ms=DEFAULT_RENEW_AHEAD_MS if renew_ahead_ms is None else renew_ahead_ms,
                             renew_max_ms=DEFAULT_RENEW_MAX_MS if renew_max_ms is None else renew_max_ms)
        with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
            runner.run(_run(config))
    except ConfigError as exc:
        click.echo(f"config error: {exc}", err=True)
        sys.exit(EXIT_CONFIG_ERROR)
    except (FerryError, OSError) as exc:
        click.echo(f"proxy failed: {exc}", err=True)
        sys.exit(1)
