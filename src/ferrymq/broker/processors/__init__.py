"""Request processors, one module per request family. Each exposes ``register(dispatcher, ctx)``."""
