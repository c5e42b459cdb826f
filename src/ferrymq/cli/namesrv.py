"""``ferry namesrv --listen 127.0.0.1:9876``: run a name server in the foreground until SIGINT/SIGTERM.

``-c namesrv.conf`` reads RocketMQ-style ``key=value`` settings: ``listenHost`` and ``listenPort`` (the name
server's address), ``kvConfigPath``, and ``enableControllerInNamesrv=true``, which also runs a controller in
the same process and event loop, configured by the controller keys of the same file (docs/controller.md;
its own port ``controllerListenPort``). Command-line options win over the file.

Exit codes: 0 after a signal, 1 when the server cannot start (e.g. address in use), 2 on a bad option.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys

import click

from ferrymq.common import logthrottle
from ferrymq.common.properties import parse_bool, parse_int, read_properties
from ferrymq.common.tls import TLS_KEYS
from ferrymq.common.tls import server_settings as tls_server_settings
from ferrymq.errors import ConfigError, FerryError

DEFAULT_LISTEN = "127.0.0.1:9876"
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 9876
#: namesrv.conf keys of the name server itself (the controller's keys are ferrymq.controller.config.KEYS)
NAMESRV_KEYS = ("listenHost", "listenPort", "kvConfigPath", "enableControllerInNamesrv", "aclEnable", "aclFile",
                "gcFreezeEnable", *TLS_KEYS)
EXIT_START_FAILED = 1
EXIT_USAGE = 2


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


class NamesrvFileConfig:
    """What a namesrv.conf says (None: not set)."""

    def __init__(self, props: dict[str, str], base_dir: str = "", path: str | None = None) -> None:
        from ferrymq.controller.config import ControllerConfig, from_properties

        #: the file and its keys (GET_NAMESRV_CONFIG shows them; UPDATE_NAMESRV_CONFIG writes back to it)
        self.path = path
        self.props = dict(props)

        self.host = props.get("listenHost", "").strip() or None
        self.port = parse_int("listenPort", props["listenPort"], minimum=0, maximum=65535) \
            if "listenPort" in props else None
        self.kv_config_path = props.get("kvConfigPath", "").strip() or None
        #: gcFreezeEnable (default true): freeze live objects out of the collector's full passes (common/gc_policy.py)
        self.gc_freeze_enable = parse_bool("gcFreezeEnable", props.get("gcFreezeEnable", "true"))
        #: tlsServerMode and tls.server.* (common/tls.py), relative paths from namesrv.conf's directory
        self.tls = tls_server_settings(props, base_dir)
        self.tls.context()
        #: aclEnable: PUT/DELETE_KV_CONFIG, DELETE_TOPIC_IN_NAMESRV, wipe/add write perm and config updates need
        #: an admin account of aclFile (default plain_acl.yml beside namesrv.conf)
        self.acl_path: str | None = None
        if parse_bool("aclEnable", props.get("aclEnable", "false")):
            acl_file = os.path.expanduser(props.get("aclFile", "").strip() or "plain_acl.yml")
            self.acl_path = os.path.join(base_dir, acl_file)
        self.controller: ControllerConfig | None = None
        if parse_bool("enableControllerInNamesrv", props.get("enableControllerInNamesrv", "false")):
            self.controller = from_properties(props, other_known_keys=NAMESRV_KEYS, base_dir=base_dir)


async def _serve(host: str, port: int, kv_config_path: str | None, metrics_port: int,
                 file_cfg: NamesrvFileConfig | None = None) -> None:
    from ferrymq.namesrv.app import NameServer

    controller_cfg = file_cfg.controller if file_cfg is not None else None
    server = NameServer(host, port, kv_config_path=kv_config_path, metrics_port=metrics_port,
                        tls=file_cfg.tls if file_cfg is not None else None,
                        acl_path=file_cfg.acl_path if file_cfg is not None else None,
                        config_path=file_cfg.path if file_cfg is not None else None,
                        file_props=file_cfg.props if file_cfg is not None else None,
                        gc_freeze_enable=file_cfg.gc_freeze_enable if file_cfg is not None else True)
    controller = None
    if controller_cfg is not None:
        from ferrymq.controller.server import ControllerServer

        controller = ControllerServer(controller_cfg)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    # handlers first: the "listening" line may be acted on (a signal sent) at once
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await server.start()
        if controller is not None:
            await controller.start()
            logging.getLogger("ferrymq.namesrv").info("controller in the name server listening on %s",
                                                      controller.addr)
        await stop.wait()
        logging.getLogger("ferrymq.namesrv").info("signal received, shutting down")
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        if controller is not None:
            await controller.stop()
        await server.stop()


def _run(host: str, port: int, kv_config_path: str | None, metrics_port: int,
         file_cfg: NamesrvFileConfig | None = None) -> None:
    try:
        import uvloop
    except ImportError:
        asyncio.run(_serve(host, port, kv_config_path, metrics_port, file_cfg))
        return
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(_serve(host, port, kv_config_path, metrics_port, file_cfg))


@click.command("namesrv")
@click.option("-c", "--config", "config_path", default=None, type=click.Path(dir_okay=False),
              help="namesrv.conf (listenHost, listenPort, kvConfigPath, enableControllerInNamesrv + controller keys)")
@click.option("--listen", default=None, help=f"host:port to serve on (port 0 = any)  [default: {DEFAULT_LISTEN}]")
@click.option("--kv-config", "kv_config_path", default=None, type=click.Path(dir_okay=False),
              help="File persisting the KV config table (default: memory only).")
@click.option("--metrics-port", type=click.IntRange(-1, 65535), default=-1, show_default=True,
              help="Prometheus endpoint (GET /metrics) on the --listen host; -1 = off, 0 = any free port.")
@click.option("--log-level", default="INFO", show_default=True,
              type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False))
def command(config_path: str | None, listen: str | None, kv_config_path: str | None, metrics_port: int,
            log_level: str) -> None:
    """Run a name server in the foreground (logs to stderr; SIGINT/SIGTERM stop it)."""
    file_cfg: NamesrvFileConfig | None = None
    if config_path is not None:
        try:
            file_cfg = NamesrvFileConfig(read_properties(config_path),
                                         os.path.dirname(os.path.abspath(config_path)),
                                         os.path.abspath(config_path))
        except ConfigError as exc:
            click.echo(f"Error: {exc}", err=True)
            sys.exit(EXIT_USAGE)
    if listen is not None:
        try:
            host, port = parse_listen(listen)
        except ValueError as exc:
            click.echo(f"Error: invalid --listen: {exc}", err=True)
            sys.exit(EXIT_USAGE)
    else:
        host = (file_cfg.host if file_cfg else None) or DEFAULT_HOST
        port = file_cfg.port if file_cfg is not None and file_cfg.port is not None else DEFAULT_PORT
    if kv_config_path is None and file_cfg is not None:
        kv_config_path = file_cfg.kv_config_path
    logthrottle.configure_server_logging(log_level.upper())
    try:
        _run(host, port, kv_config_path, metrics_port, file_cfg)
    except ConfigError as exc:
        click.echo(f"Error: {exc}", err=True)
        sys.exit(EXIT_USAGE)
    except (OSError, FerryError) as exc:
        click.echo(f"Error: cannot start name server on {host}:{port}: {exc}", err=True)
        sys.exit(EXIT_START_FAILED)
