"""Peer: NATS JetStream (Debian's ``nats-server``, PyPI ``nats-py``): one stream with file storage, published
to by one client awaiting each publish's ack.

Durability: JetStream acknowledges a publish once the message is written to its file store (the page cache);
it fsyncs on a timer (``sync_interval``, 2 minutes by default), so the ack does not wait for the disk: the
peer of ASYNC_FLUSH, not of SYNC_FLUSH. Single server, no replicas."""

from __future__ import annotations

import os
import shutil

from ferrymq.cli.bench_impl.procs import HOST, Supervisor, free_port

STREAM = "FERRYBENCH"
SUBJECT = "ferrybench.msgs"
DURABILITY = "JetStream file store, ack after write (fsync every 2 min), 1 replica"


def available() -> str | None:
    """None when usable, else the reason to skip."""
    if shutil.which("nats-server") is None:
        return "nats-server not installed (apt-get install -y nats-server)"
    try:
        import nats  # noqa: F401
    except ImportError:
        return "PyPI package 'nats-py' not installed (pip install 'ferrymq[bench]')"
    return None


class NatsServer:
    def __init__(self, sup: Supervisor) -> None:
        self.sup = sup
        self.port = free_port()
        store = sup.path("nats", "store")
        os.makedirs(store, exist_ok=True)
        self.child = sup.spawn("nats", ["nats-server", "-a", HOST, "-p", str(self.port), "-js", "-sd", store],
                               port=self.port)
        sup.wait_port(self.child)

    @property
    def url(self) -> str:
        return f"nats://{HOST}:{self.port}"

    def close(self) -> None:
        self.sup.stop(self.child)
