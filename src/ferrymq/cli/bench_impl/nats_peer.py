"""Peer: NATS JetStream (Debian's ``nats-server``, PyPI ``nats-py``): one stream with file storage, published
to by one client awaiting each publish's ack.

Durability: JetStream acknowledges a publish once the message is written to its file store (the page cache);
it fsyncs on a timer (``sync_interval``, 2 minutes by default), so the ack does not wait for the disk: the
peer of ASYNC_FLUSH, not of SYNC_FLUSH. Single server, no replicas.

The server also opens its HTTP monitoring port: ``stored_messages()`` reads the messages JetStream holds
(``/jsz``), the count of acknowledged publishes the server's CPU per message is divided by."""

from __future__ import annotations

import json
import os
import shutil
import urllib.request

from ferrymq.cli.bench_impl.procs import HOST, Supervisor, free_port

STREAM = "FERRYBENCH"
SUBJECT = "ferrybench.msgs"
DURABILITY = "JetStream file store, ack after write (fsync every 2 min), 1 replica"
#: how long a read of the monitoring endpoint may take
MONITOR_TIMEOUT_S = 10.0


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
        self.monitor_port = free_port()
        store = sup.path("nats", "store")
        os.makedirs(store, exist_ok=True)
        self.child = sup.spawn("nats", ["nats-server", "-a", HOST, "-p", str(self.port), "-m",
                                        str(self.monitor_port), "-js", "-sd", store], port=self.port)
        sup.wait_port(self.child)

    def stored_messages(self) -> int:
        """Messages held by all JetStream streams of the server (``/jsz``)."""
        url = f"http://{HOST}:{self.monitor_port}/jsz"
        with urllib.request.urlopen(url, timeout=MONITOR_TIMEOUT_S) as resp:  # noqa: S310 - our own server
            return int(json.load(resp).get("messages", 0))

    @property
    def url(self) -> str:
        return f"nats://{HOST}:{self.port}"

    def close(self) -> None:
        self.sup.stop(self.child)
