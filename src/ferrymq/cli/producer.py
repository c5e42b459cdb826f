"""``ferry producer connection``."""

from __future__ import annotations

import click

from ferrymq.cli.consumer_ops import producer_connection


@click.group("producer")
def command() -> None:
    """Producer groups."""


command.add_command(producer_connection)
