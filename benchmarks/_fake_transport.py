"""A producer wired to a fake broker transport, for the client CPU benchmarks (client_inproc.py,
client_batch.py): no sockets, every request answered with SEND_OK on the next loop iteration, so the
process CPU time per send is the client's own Python.

Imported inside the benchmark child processes, after ``PYTHONPATH`` selected the tree under test.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

import orjson

_OPAQUE = re.compile(rb'"opaque":(\d+)')
TOPIC = "HotPath"
BROKER_ADDR = "127.0.0.1:10911"


class FakeBroker:
    """Transport of a client ``Connection``: answers every request with the broker's SEND_OK field set;
    ``queueOffset`` advances by ``msgs_per_request`` per answer."""

    def __init__(self, conn: Any, msgs_per_request: int = 1) -> None:
        self.conn = conn
        self.loop = asyncio.get_running_loop()
        self.offset = 0
        self.msgs_per_request = msgs_per_request

    def write(self, data: bytes) -> None:
        m = _OPAQUE.search(data, 8, 800)
        assert m is not None
        self.offset += self.msgs_per_request
        header = orjson.dumps({
            "code": 0, "extFields": {"msgId": "7F00000100002A9F0000000000A1B2C3", "queueId": "3",
                                     "queueOffset": str(self.offset), "MSG_REGION": "DefaultRegion",
                                     "TRACE_ON": "true"},
            "flag": 1, "language": "JAVA", "opaque": int(m.group(1)), "serializeTypeCurrentRPC": "JSON",
            "version": 407})
        frame = (4 + len(header)).to_bytes(4, "big") + len(header).to_bytes(4, "big") + header
        self.loop.call_soon(self.conn.data_received, frame)

    def writelines(self, parts: Any) -> None:
        self.write(b"".join(parts))

    def get_extra_info(self, key: str, default: Any = None) -> Any:
        return ("127.0.0.1", 10911) if key in ("peername", "sockname") else default

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        pass

    def abort(self) -> None:
        pass


async def start_fake_producer(group: str, *, msgs_per_request: int = 1, fault: bool = False) -> Any:
    """A started ``Producer`` whose instance knows a one-broker route of TOPIC (16 write queues) and holds a
    connection to BROKER_ADDR over a FakeBroker."""
    from ferrymq.client import Producer
    from ferrymq.common.route import BrokerData, QueueData, TopicRouteData
    from ferrymq.remoting.connection import Connection

    p = Producer("127.0.0.1:9876", group, send_latency_fault_enable=fault)
    await p.start()
    inst = p.instance
    inst.routes[TOPIC] = TopicRouteData(
        queue_datas=[QueueData("broker-a", 16, 16, 6)],
        broker_datas=[BrokerData("DefaultCluster", "broker-a", {0: BROKER_ADDR})])
    inst._rebuild_broker_addrs()
    conn = Connection(inst.pool.dispatcher)
    conn.connection_made(FakeBroker(conn, msgs_per_request))  # type: ignore[arg-type]
    inst.pool._conns[BROKER_ADDR] = conn
    return p


async def close_fake_producer(p: Any) -> None:
    """Forget the fake route and connection (nothing to unregister from), then close."""
    p.instance._inner_producer = None
    p.instance.pool._conns.clear()
    p.instance.routes.clear()
    p.instance.broker_addrs = {}
    await p.close()
