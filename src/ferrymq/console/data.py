"""What the console shows, read through the admin client: brokers with roles and replication lag, topics with
per-queue offsets, consumer groups with lag per queue, messages by id or key, and a ring of samples (TPS and
lag over the last minutes) taken by a background task."""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from ferrymq.client import Admin
from ferrymq.common.message import MessageExt
from ferrymq.errors import FerryError
from ferrymq.remoting import jsonx
from ferrymq.remoting.codec import RemotingCommand
from ferrymq.remoting.codes import RequestCode

log = logging.getLogger(__name__)

#: seconds between two samples, and how many are kept (10 minutes at 5 s)
SAMPLE_INTERVAL_S = 5.0
SAMPLES_KEPT = 120
#: groups that are the brokers' own, hidden from the group list
SYSTEM_GROUPS = frozenset({"TOOLS_CONSUMER", "FILTERSRV_CONSUMER", "SELF_TEST_C_GROUP", "CID_ONS-HTTP-PROXY",
                           "CID_ONSAPI_PERMISSION", "CID_ONSAPI_OWNER", "CID_ONSAPI_PULL", "CID_RMQ_SYS_TRANS",
                           "CLIENT_INNER_PRODUCER"})


def first_rate(value: str | None) -> float:
    """The first figure of a runtime-info rate ("12.5 10.1 9.0" -> 12.5); 0 when absent."""
    try:
        return float((value or "0").split()[0])
    except (ValueError, IndexError):
        return 0.0


@dataclass
class BrokerRow:
    cluster: str
    broker_name: str
    broker_id: int
    addr: str
    role: str = ""
    put_tps: float = 0.0
    get_tps: float = 0.0
    max_phy_offset: int = 0
    #: bytes behind its master (slaves), None for masters or when unknown
    lag_bytes: int | None = None
    error: str = ""


@dataclass
class QueueLag:
    topic: str
    broker_name: str
    queue_id: int
    broker_offset: int
    consumer_offset: int

    @property
    def lag(self) -> int:
        return max(self.broker_offset - max(self.consumer_offset, 0), 0)


@dataclass
class Samples:
    """A ring of (epoch seconds, {series: value}) samples."""

    kept: int = SAMPLES_KEPT
    points: collections.deque[tuple[float, dict[str, float]]] = field(default_factory=collections.deque)

    def add(self, at_s: float, values: dict[str, float]) -> None:
        self.points.append((at_s, values))
        while len(self.points) > self.kept:
            self.points.popleft()

    def as_columns(self, prefix: str = "") -> dict[str, Any]:
        """{"t": [...], "series": {name: [...]}} for the series starting with ``prefix`` (None where missing)."""
        names = sorted({n for _, values in self.points for n in values if n.startswith(prefix)})
        return {"t": [t for t, _ in self.points],
                "series": {n: [values.get(n) for _, values in self.points] for n in names}}


class ConsoleData:
    def __init__(self, admin: Admin) -> None:
        self.admin = admin
        self.samples = Samples()

    async def brokers(self) -> list[BrokerRow]:
        rows = [BrokerRow(b.cluster, b.broker_name, b.broker_id, b.addr) for b in await self.admin.brokers()]

        async def fill(row: BrokerRow) -> None:
            try:
                info = await self.admin.broker_runtime_info(row.addr)
            except (FerryError, OSError) as exc:
                row.error = str(exc)
                return
            row.role = info.get("brokerRole", "")
            row.put_tps = first_rate(info.get("putTps"))
            row.get_tps = first_rate(info.get("getTransferedTps"))
            row.max_phy_offset = int(info.get("commitLogMaxOffset", "0") or 0)

        await asyncio.gather(*(fill(r) for r in rows))
        masters = {r.broker_name: r for r in rows if r.broker_id == 0 and not r.error}
        for r in rows:
            master = masters.get(r.broker_name)
            if r.broker_id != 0 and master is not None and not r.error:
                r.lag_bytes = max(master.max_phy_offset - r.max_phy_offset, 0)
        return rows

    async def topics(self) -> list[str]:
        return sorted(await self.admin.topic_list())

    async def topic_queues(self, topic: str) -> list[dict[str, Any]]:
        """Per readable queue: broker, id, min and max offset, last store time (TopicNotExistError if unknown)."""
        rows = []
        for mq, lo, hi, last_ms in await self.admin.topic_status(topic):
            rows.append({"brokerName": mq.broker_name, "queueId": mq.queue_id, "minOffset": lo, "maxOffset": hi,
                         "messages": hi - lo, "lastUpdate": _fmt_ms(last_ms)})
        return rows

    async def groups(self) -> list[str]:
        names: set[str] = set()
        for b in await self.admin.brokers(masters_only=True):
            try:
                resp = await self.admin.instance.invoke(b.addr, RemotingCommand.request(
                    RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG))
            except (FerryError, OSError) as exc:
                log.info("groups of %s unavailable: %s", b.addr, exc)
                continue
            table = (jsonx.loads(resp.body).get("subscriptionGroupTable") or {}) if resp.body else {}
            names |= set(table)
        return sorted(n for n in names if n not in SYSTEM_GROUPS)

    async def group_lag(self, group: str) -> list[QueueLag]:
        out: list[QueueLag] = []
        for b in await self.admin.brokers(masters_only=True):
            try:
                stats = await self.admin.consume_stats(b.addr, group)
            except (FerryError, OSError) as exc:
                log.info("consume stats of %s from %s unavailable: %s", group, b.addr, exc)
                continue
            for mq, s in sorted(stats.items()):
                out.append(QueueLag(mq.topic, mq.broker_name, mq.queue_id, s["brokerOffset"], s["consumerOffset"]))
        return out

    async def find_messages(self, msg_id: str | None, topic: str | None, key: str | None) -> list[MessageExt]:
        if msg_id:
            return [await self.admin.find_message(msg_id, topic or None)]
        assert topic and key
        return await self.admin.query_messages_by_key(topic, key, 32)

    async def sample_once(self) -> None:
        values: dict[str, float] = {}
        for r in await self.brokers():
            if r.error:
                continue
            values[f"putTps {r.broker_name}/{r.broker_id}"] = r.put_tps
            values[f"getTps {r.broker_name}/{r.broker_id}"] = r.get_tps
            if r.lag_bytes is not None:
                values[f"replicaLagBytes {r.broker_name}/{r.broker_id}"] = float(r.lag_bytes)
        for group in await self.groups():
            values[f"lag {group}"] = float(sum(q.lag for q in await self.group_lag(group)))
        self.samples.add(time.time(), values)

    async def sample_forever(self, interval_s: float = SAMPLE_INTERVAL_S) -> None:
        while True:
            try:
                await self.sample_once()
            except (FerryError, OSError) as exc:
                log.info("sample skipped: %s", exc)
            await asyncio.sleep(interval_s)


def _fmt_ms(ms: int) -> str:
    if ms <= 0:
        return ""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ms / 1000))
