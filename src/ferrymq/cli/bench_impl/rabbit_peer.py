"""Peer: RabbitMQ (Debian's ``rabbitmq-server``, PyPI ``aio-pika``): a durable classic queue, persistent
messages, one client publishing with publisher confirms and awaiting each confirm.

Durability: a persistent message to a durable queue is confirmed once it is written to the message store and
fsynced (RabbitMQ batches the fsyncs of concurrent publishers): the fsync-before-ack peer of SYNC_FLUSH.
Single node, no mirrors. ``queue_depth()`` reads the messages the queue holds (the acknowledged publishes the
server's CPU per message is divided by) and ``purge()`` empties it after a run. The node runs with its own data, log and config directories under the bench's
work dir, on free ports (AMQP and the Erlang distribution port), and is stopped with the bench."""

from __future__ import annotations

import asyncio
import os
import shutil
import time

from ferrymq.cli.bench_impl.procs import HOST, Supervisor, free_port, port_open

QUEUE = "ferrybench"
DURABILITY = "durable queue, persistent messages, publisher confirm after fsync, 1 node"
#: a RabbitMQ node takes several seconds to boot (Erlang VM, Mnesia)
START_TIMEOUT_S = 120.0


def _server_binary() -> str | None:
    """The node's own start script first: Debian's /usr/sbin wrapper switches to the ``rabbitmq`` user when run
    as root, which cannot write the bench's directories."""
    for path in ("/usr/lib/rabbitmq/bin/rabbitmq-server", shutil.which("rabbitmq-server")):
        if path and os.path.exists(path):
            return path
    return None


def available() -> str | None:
    """None when usable, else the reason to skip."""
    if _server_binary() is None:
        return "rabbitmq-server not installed (apt-get install -y rabbitmq-server)"
    try:
        import aio_pika  # noqa: F401
    except ImportError:
        return "PyPI package 'aio-pika' not installed (pip install 'ferrymq[bench]')"
    return None


class RabbitServer:
    def __init__(self, sup: Supervisor) -> None:
        self.sup = sup
        self.port = free_port()
        dist_port = free_port()
        # the node's own Erlang port mapper, in the foreground, so it is stopped with the bench (the node would
        # otherwise start a daemonized epmd that outlives it)
        self.epmd = None
        epmd_port = free_port()
        epmd_env: dict[str, str] = {}
        if shutil.which("epmd") is not None:
            self.epmd = sup.spawn("rabbitmq-epmd", ["epmd", "-port", str(epmd_port), "-address", HOST],
                                  port=epmd_port)
            sup.wait_port(self.epmd)
            epmd_env["ERL_EPMD_PORT"] = str(epmd_port)
        base = sup.path("rabbitmq")
        for sub in ("mnesia", "log", "conf"):
            os.makedirs(os.path.join(base, sub), exist_ok=True)
        node = f"ferrybench{self.port}@localhost"
        env = {
            "RABBITMQ_NODENAME": node,
            "RABBITMQ_NODE_IP_ADDRESS": HOST,
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(dist_port),
            "RABBITMQ_MNESIA_BASE": os.path.join(base, "mnesia"),
            "RABBITMQ_LOG_BASE": os.path.join(base, "log"),
            "RABBITMQ_CONFIG_FILE": os.path.join(base, "conf", "rabbitmq"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": os.path.join(base, "conf", "enabled_plugins"),
            "RABBITMQ_PID_FILE": os.path.join(base, "rabbitmq.pid"),
            "HOME": base,  # the Erlang cookie
            **epmd_env,
        }
        with open(os.path.join(base, "conf", "enabled_plugins"), "w") as fh:
            fh.write("[].\n")
        binary = _server_binary()
        assert binary is not None
        self.child = sup.spawn("rabbitmq", [binary], port=self.port, env=env)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not port_open(self.port):
            if not self.child.alive():
                raise RuntimeError(f"rabbitmq-server exited:\n{self.child.log_tail()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"rabbitmq-server did not open its port in {START_TIMEOUT_S}s")
            time.sleep(0.2)

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@{HOST}:{self.port}/"

    def queue_depth(self) -> int:
        """Messages in the bench's queue (0 before its first declaration)."""
        return asyncio.run(self._on_queue(purge=False))

    def purge(self) -> None:
        asyncio.run(self._on_queue(purge=True))

    async def _on_queue(self, *, purge: bool) -> int:
        import aio_pika  # type: ignore[import-not-found]

        conn = await aio_pika.connect(self.url)
        try:
            channel = await conn.channel()
            queue = await channel.declare_queue(QUEUE, durable=True)
            if purge:
                await queue.purge()
                return 0
            return int(queue.declaration_result.message_count or 0)
        finally:
            await conn.close()

    def close(self) -> None:
        self.sup.stop(self.child)
        if self.epmd is not None:
            self.sup.stop(self.epmd)
