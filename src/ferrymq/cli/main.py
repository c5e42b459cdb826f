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
    "bench": "bench",
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


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="ferrymq")
def cli() -> None:
    """ferrymq: a RocketMQ 4.x wire-compatible message broker."""


def main() -> None:
    cli()


if __name__ == "__main__":
    main()
