"""ferrymq: a RocketMQ 4.x wire-compatible broker in Python."""

__version__ = "0.1.0"
