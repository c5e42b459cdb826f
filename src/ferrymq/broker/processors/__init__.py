"""Request processors, one module per request family. Each takes its context (``broker/context.py``: only the
parts of the broker it uses) and exposes ``register(dispatcher)``."""
