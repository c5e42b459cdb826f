"""``ferry broker -c broker.conf [-n "127.0.0.1:9876;127.0.0.1:9877"]``: run one broker in the foreground.

The operations verbs on running brokers (``ferry broker config get|set``, ``wipe-write-perm``, ...) are
subcommands of the same group (cli/broker_ops.py)."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from collections.abc import Callable
from typing import Any

import click

from ferrymq.common import logthrottle
from ferrymq.errors import ConfigError, FerryError

EXIT_CONFIG_ERROR = 2
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def event_loop_factory() -> Callable[[], asyncio.AbstractEventLoop]:
    """uvloop when installed, else asyncio's default loop."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop
    return uvloop.new_event_loop


async def wait_for_signal() -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError):
            pass
    await stop.wait()


async def _run(config_path: str, namesrv: str | None) -> None:
    from ferrymq.broker.app import BrokerController
    from ferrymq.broker.config import load_config
    from ferrymq.store.errors import StoreConfigMismatchError, StoreDirError
    from ferrymq.store.queue_table import raise_open_files_limit

    overrides = {"namesrvAddr": namesrv} if namesrv else None
    cfg = load_config(config_path, overrides)
    soft, hard = raise_open_files_limit()  # before the store sizes its open files from it
    logging.getLogger(__name__).info("open files limit %s (hard %s)", soft, hard)
    try:
        ctl = BrokerController(cfg)
        await ctl.start()
    except StoreDirError as exc:  # a locked or unusable store directory is a set-up error, not a crash
        raise ConfigError("storePathRootDir", str(exc)) from None
    except StoreConfigMismatchError as exc:  # a store written with another layout setting
        raise ConfigError(exc.key, str(exc)) from None
    grpc_server = None
    try:
        if cfg.enable_grpc_server:  # local mode of the gRPC endpoint (docs/grpc.md)
            grpc_server = await _start_grpc(ctl)
        click.echo(f"ferrymq broker {cfg.broker_name} (id {cfg.broker_id}, {cfg.broker_role.value}) serving on "
                   f"{ctl.bind_addr} (registered as {ctl.broker_addr})")
        sys.stdout.flush()
        await wait_for_signal()
    finally:
        if grpc_server is not None:
            await grpc_server.stop()
        await ctl.stop()


async def _start_grpc(ctl: Any) -> Any:
    """The gRPC proxy in the broker process, finding brokers through this broker's name servers."""
    from ferrymq.proxy.config import ProxyConfig
    from ferrymq.proxy.loopback import LocalBroker
    from ferrymq.proxy.server import ProxyServer, admin_credentials, guard_source

    cfg = ctl.config
    if not cfg.namesrv_addr:
        raise ConfigError("enableGrpcServer", "the gRPC endpoint needs namesrvAddr")
    guard = ctl.acl_guard  # aclEnable: 5.x clients are checked against the broker's own plain_acl.yml
    access_key, secret_key = admin_credentials(guard.acl) if guard is not None else ("", "")
    server = ProxyServer(ProxyConfig(
        ";".join(cfg.namesrv_addr), listen_host=cfg.listen_host, listen_port=cfg.grpc_server_port,
        delay_levels_ms=tuple(ctl.delay_levels_ms), max_delivery_attempts=cfg.grpc_max_delivery_attempts,
        fifo_groups=frozenset(g.strip() for g in cfg.grpc_fifo_groups.split(",") if g.strip()),
        tls=cfg.tls_client, tls_server=cfg.tls_server, access_key=access_key, secret_key=secret_key,
        auto_renew_invisible_ms=cfg.grpc_auto_renew_invisible_time_ms, renew_ahead_ms=cfg.grpc_renew_ahead_time_ms,
        renew_max_ms=cfg.grpc_renew_max_time_ms),
        acl_source=guard_source(guard) if guard is not None else None,
        local_broker=LocalBroker(ctl.broker_addr, ctl.dispatcher, ctl._on_connection_closed))
    await server.start()
    click.echo(f"ferrymq gRPC endpoint serving on {cfg.listen_host}:{server.port}")
    return server


@click.group("broker", invoke_without_command=True)
@click.option("-c", "--config", "config_path", default=None, type=click.Path(dir_okay=False),
              help="broker .properties file (RocketMQ key names); required to run a broker")
@click.option("-n", "--namesrv", default=None, help='name servers, e.g. "127.0.0.1:9876;127.0.0.1:9877"')
@click.option("--log-level", default="INFO", show_default=True)
@click.pass_context
def command(ctx: click.Context, config_path: str | None, namesrv: str | None, log_level: str) -> None:
    """Run a broker until SIGINT/SIGTERM (``-c broker.conf``), or operate running brokers (subcommands)."""
    if ctx.invoked_subcommand is not None:
        return
    if config_path is None:
        raise click.UsageError("Missing option '-c' / '--config' (or give a subcommand)")
    if log_level.upper() not in LOG_LEVELS:
        click.echo(f"config error: --log-level: expected one of {', '.join(LOG_LEVELS)}, got {log_level!r}",
                   err=True)
        sys.exit(EXIT_CONFIG_ERROR)
    logthrottle.configure_server_logging(log_level.upper())
    try:
        with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
            runner.run(_run(config_path, namesrv))
    except ConfigError as exc:
        click.echo(f"config error: {exc}", err=True)
        sys.exit(EXIT_CONFIG_ERROR)
    except FerryError as exc:
        click.echo(f"broker failed: {exc}", err=True)
        sys.exit(1)
    except OSError as exc:
        click.echo(f"broker failed: {exc}", err=True)
        sys.exit(1)


def _add_ops_verbs() -> None:
    from ferrymq.cli import admin_verbs, broker_ops

    for verb in (*broker_ops.VERBS, *admin_verbs.BROKER_VERBS):
        command.add_command(verb)


_add_ops_verbs()
