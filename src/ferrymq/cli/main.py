"""``ferry`` command line: a thin click group; each noun lives in its own module ``ferrymq.cli.<noun>``
exposing a click command or group named ``command``. Modules are imported only when their verb runs."""

from __future__ import annotations

import importlib
import importlib.util

import click

#: verb -> module under ferrymq.cli
COMMANDS = {
    "namesrv": "namesrv",
    "broker": "broker",
    "quickstart": "quickstart",
    "topic": "topic",
    "cluster": "cluster",
    "consumer": "consumer",
    "producer": "producer",
    "message": "message",
    "produce": "produce",
    "consume": "consume",
    "ha": "ha",
    "controller": "controller",
    "acl": "acl",
    "group": "group",
    "kv": "kv",
    "namesrv-config": "namesrv_config",
    "console": "console",
    "bench": "bench",
    "stats": "stats",
    "proxy": "proxy",
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        names = []
        for name, mod in COMMANDS.items():
            try:
                importlib.util.find_spec(f"ferrymq.cli.{mod}")  # type: ignore[attr-defined]
            except ModuleNotFoundError:
                continue
            if importlib.util.find_spec(f"ferrymq.cli.{mod}") is not None:  # type: ignore[attr-defined]
                names.append(name)
        return names

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        mod = COMMANDS.get(cmd_name)
        if mod is None:
            return None
        try:
            module = importlib.import_module(f"ferrymq.cli.{mod}")
        except ModuleNotFoundError as exc:
            if exc.name == f"ferrymq.cli.{mod}":
                return None
            raise
        cmd: click.Command = module.command
        return cmd

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The command list with each command's first sentence whole (click cuts it to the line and at the first
        ". ", which splits "e.g."), reST ``literal`` markup shown as plain text."""
        rows = []
        for name in self.list_commands(ctx):
            cmd = self.get_command(ctx, name)
            if cmd is None or cmd.hidden:
                continue
            rows.append((name, cmd.short_help or first_sentence(cmd.help or "")))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


#: abbreviations whose period does not end a sentence
_ABBREVIATIONS = ("e.g.", "i.e.", "etc.", "vs.")


def first_sentence(text: str) -> str:
    """The first sentence of a docstring, on one line, without reST literal markup."""
    flat = " ".join(text.replace("``", "").split())
    start = 0
    while True:
        end = flat.find(". ", start)
        if end < 0:
            return flat
        if not any(flat[: end + 1].endswith(a) for a in _ABBREVIATIONS):
            return flat[: end + 1]
        start = end + 2


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="ferrymq")
@click.option("--access-key", envvar="FERRY_ACCESS_KEY", default="",
              help="ACL access key: the client verbs sign their requests (env FERRY_ACCESS_KEY)")
@click.option("--secret-key", envvar="FERRY_SECRET_KEY", default="",
              help="ACL secret key (env FERRY_SECRET_KEY)")
@click.option("--tls", "use_tls", is_flag=True, envvar="FERRY_TLS",
              help="Connect to name servers and brokers with TLS (env FERRY_TLS=1)")
@click.option("--tls-trust-cert", envvar="FERRY_TLS_TRUST_CERT", default="", metavar="PEM",
              help="CA certificates the server must chain to (implies --tls; without it the server is not "
                   "authenticated)")
@click.option("--tls-cert", envvar="FERRY_TLS_CERT", default="", metavar="PEM",
              help="Client certificate, for servers with tls.server.need.client.auth")
@click.option("--tls-key", envvar="FERRY_TLS_KEY", default="", metavar="PEM", help="Key of --tls-cert")
def cli(access_key: str, secret_key: str, use_tls: bool, tls_trust_cert: str, tls_cert: str, tls_key: str) -> None:
    """ferrymq: a RocketMQ 4.x wire-compatible message broker."""
    if access_key:
        from ferrymq.client.config import set_default_credentials

        set_default_credentials(access_key, secret_key)
    if use_tls or tls_trust_cert or tls_cert:
        from ferrymq.common.tls import TlsClientSettings, set_default_client_tls
        from ferrymq.errors import ConfigError

        try:
            set_default_client_tls(TlsClientSettings(trust_cert_path=tls_trust_cert, cert_path=tls_cert,
                                                     key_path=tls_key))
        except ConfigError as exc:
            raise click.UsageError(str(exc)) from None


def main() -> None:
    cli()


if __name__ == "__main__":
    main()
