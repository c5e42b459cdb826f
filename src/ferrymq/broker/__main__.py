"""``python -m ferrymq.broker -c broker.conf [-n "a:9876;b:9876"]`` (same as ``ferry broker``)."""

from ferrymq.cli.broker import command

command()
