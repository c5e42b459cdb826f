"""``ferry producer connection|all``."""

from __future__ import annotations

import click

from ferrymq.cli.consumer_ops import all_producers, producer_connection


@click.group("producer")
def command() -> None:
    """Producer groups."""


command.add_command(producer_connection)
command.add_command(all_producers)
