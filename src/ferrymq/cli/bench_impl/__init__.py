"""Implementation of ``ferry bench`` (kept out of ``ferrymq.cli.bench`` so the CLI module stays thin).

Layering: this package may import ``ferrymq.client`` / ``ferrymq.remoting`` / ``ferrymq.common``; name servers,
brokers, Redis and the echo server always run as subprocesses, and client load runs in worker processes.
"""
