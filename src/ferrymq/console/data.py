"""What the console shows, read through the admin client: brokers with roles and replication lag (brokers
seen before and gone since stay, marked dead), topics with per-queue offsets, consumer groups with lag per queue
and their clients, producers, dead-letter queues, messages by id, key or time range with their consumption
state per group, broker configs, HA and controller state, and a ring of samples (TPS and lag over the last
minutes) taken by a background task.

Severity of a figure (``severity``): ``ok`` at 0, ``low`` below the warning threshold, ``warn`` below the
critical one, ``critical`` from it on; the thresholds are the named constants below (messages of consumer lag,
bytes of replication lag).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from ferrymq.client import Admin, api, ops, ops_admin, ops_more
from ferrymq.client.controller_admin import ControllerAdmin, parse_addrs
from ferrymq.common.message import PROPERTY_RETRY_TOPIC, MessageExt, bytes_to_host
from ferrymq.common.route import MASTER_ID, MessageQueue
from ferrymq.common.topic import DLQ_GROUP_TOPIC_PREFIX, RETRY_GROUP_TOPIC_PREFIX, dlq_topic
from ferrymq.errors import ClientError, FerryError, TopicNotExistError
from ferrymq.remoting import jsonx
from ferrymq.remoting.codec import RemotingCommand
from ferrymq.remoting.codes import RequestCode

log = logging.getLogger(__name__)

#: seconds between two samples, and how many are kept (10 minutes at 5 s)
SAMPLE_INTERVAL_S = 5.0
SAMPLES_KEPT = 120
#: timeout of the sampler's calls to one broker: a hung broker costs the sample this long, not the client's
#: request timeout
SAMPLE_CALL_TIMEOUT_MS = 1_500
#: groups that are the brokers' own, hidden from the group list
SYSTEM_GROUPS = frozenset({"TOOLS_CONSUMER", "FILTERSRV_CONSUMER", "SELF_TEST_C_GROUP", "CID_ONS-HTTP-PROXY",
                           "CID_ONSAPI_PERMISSION", "CID_ONSAPI_OWNER", "CID_ONSAPI_PULL", "CID_RMQ_SYS_TRANS",
                           "CLIENT_INNER_PRODUCER"})
#: consumer lag (messages) from which a figure is amber, and red
LAG_WARN_MESSAGES = 1_000
LAG_CRITICAL_MESSAGES = 10_000
#: replication lag (bytes behind the master) from which a figure is amber, and red
REPLICA_LAG_WARN_BYTES = 1 << 20
REPLICA_LAG_CRITICAL_BYTES = 64 << 20
#: most messages a time-range search or a DLQ page shows
MESSAGES_SHOWN_MAX = 64
#: consumer groups listed on the overview, the most lagging first
OVERVIEW_GROUPS_SHOWN = 10
#: brokers remembered after they were last seen (a killed one stays on the page, red, this long)
DEAD_BROKER_KEPT_S = 24 * 3600.0
#: the producer group of the console's test and DLQ re-sends
CONSOLE_PRODUCER_GROUP = "FERRYMQ_CONSOLE_PRODUCER"
#: properties the broker or the producer sets, dropped when a dead-lettered message is sent again
RESEND_DROPPED_PROPERTIES = frozenset({
    "UNIQ_KEY", "DELAY", "REAL_TOPIC", "REAL_QID", "WAIT", "MIN_OFFSET", "MAX_OFFSET", "TRAN_MSG", "PGROUP",
    "CLUSTER", "MAX_RECONSUME_TIMES", "RECONSUME_TIME", "CONSUME_START_TIME", "__STARTDELIVERTIME",
    "TRAN_PREPARED_QUEUE_OFFSET", "TRANSACTION_CHECK_TIMES"})


def severity(value: float | None, warn: float, critical: float) -> str:
    """The CSS class of a figure: ``ok`` (0 or none), ``low``, ``warn`` or ``critical``."""
    if not value or value <= 0:
        return "ok"
    if value < warn:
        return "low"
    return "warn" if value < critical else "critical"


def lag_severity(messages: float | None) -> str:
    return severity(messages, LAG_WARN_MESSAGES, LAG_CRITICAL_MESSAGES)


def replica_lag_severity(lag_bytes: float | None) -> str:
    return severity(lag_bytes, REPLICA_LAG_WARN_BYTES, REPLICA_LAG_CRITICAL_BYTES)


def fmt_ms(ms: int | str | None) -> str:
    """Epoch milliseconds as local ``YYYY-MM-DD HH:MM:SS.mmm``; "" for 0, none or not a number."""
    try:
        value = int(ms or 0)
    except (TypeError, ValueError):
        return ""
    if value <= 0:
        return ""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(value / 1000)) + f".{value % 1000:03d}"


def first_rate(value: str | None) -> float:
    """The first figure of a runtime-info rate ("12.5 10.1 9.0" -> 12.5); 0 when absent."""
    try:
        return float((value or "0").split()[0])
    except (ValueError, IndexError):
        return 0.0


def _json_field(info: dict[str, str], key: str) -> Any:
    raw = info.get(key)
    if not raw:
        return None
    try:
        return jsonx.loads(raw)
    except ValueError:
        return None


@dataclass
class BrokerRow:
    cluster: str
    broker_name: str
    #: the id the broker registered with at the name server (0 = master)
    broker_id: int
    addr: str
    role: str = ""
    put_tps: float = 0.0
    get_tps: float = 0.0
    max_phy_offset: int = 0
    #: bytes behind its master (slaves), None for masters or when unknown
    lag_bytes: int | None = None
    error: str = ""
    #: not registered with the name server any more, or not answering
    dead: bool = False
    #: the controller's replica id (controller mode), None otherwise
    replica_id: int | None = None
    master_epoch: int | None = None
    boot_ms: int = 0
    last_seen_s: float = 0.0
    runtime: dict[str, str] = field(default_factory=dict)

    @property
    def shown_id(self) -> int:
        """The id an operator knows the replica by: the controller's in controller mode."""
        return self.replica_id if self.replica_id is not None else self.broker_id

    @property
    def is_master(self) -> bool:
        return self.broker_id == MASTER_ID


@dataclass
class QueueLag:
    topic: str
    broker_name: str
    queue_id: int
    broker_offset: int
    consumer_offset: int
    last_timestamp_ms: int = 0

    @property
    def lag(self) -> int:
        return max(self.broker_offset - max(self.consumer_offset, 0), 0)


@dataclass
class Samples:
    """A ring of (epoch seconds, {series: value}, {series whose value is unknown}) samples. A series whose
    source did not answer keeps its last value, marked unknown, so a chart shows no gap but a marker."""

    kept: int = SAMPLES_KEPT
    points: collections.deque[tuple[float, dict[str, float], frozenset[str]]] = field(
        default_factory=collections.deque)

    def add(self, at_s: float, values: dict[str, float], unknown: frozenset[str] = frozenset()) -> None:
        self.points.append((at_s, values, unknown))
        while len(self.points) > self.kept:
            self.points.popleft()

    def latest(self) -> dict[str, float]:
        """The values of the newest sample ({} before the first)."""
        return dict(self.points[-1][1]) if self.points else {}

    def last(self, name: str) -> float | None:
        for _, values, _unknown in reversed(self.points):
            if name in values:
                return values[name]
        return None

    def as_columns(self, prefix: str = "") -> dict[str, Any]:
        """{"t": [...], "series": {name: [...]}, "unknown": {name: [indexes]}} for the series starting with
        ``prefix`` (None where a series has no value yet)."""
        names = sorted({n for _, values, _u in self.points for n in values if n.startswith(prefix)})
        unknown = {n: [i for i, (_, _v, u) in enumerate(self.points) if n in u] for n in names}
        return {"t": [t for t, _, _u in self.points],
                "series": {n: [values.get(n) for _, values, _u in self.points] for n in names},
                "unknown": {n: idx for n, idx in unknown.items() if idx}}


class ConsoleData:
    def __init__(self, admin: Admin, *, controller_addrs: str = "") -> None:
        self.admin = admin
        self.samples = Samples()
        #: (broker name, address) -> the row last seen alive (a broker that vanishes stays, dead)
        self.known: dict[tuple[str, str], BrokerRow] = {}
        self.controller_addrs = controller_addrs
        #: the controllers named by a controller-mode broker's config (when not given)
        self._found_controller_addrs = ""

    # ---- brokers -----------------------------------------------------------------------------------------
    async def brokers(self, *, timeout_ms: int | None = None) -> list[BrokerRow]:
        rows = [BrokerRow(b.cluster, b.broker_name, b.broker_id, b.addr) for b in await self.admin.brokers()]

        async def fill(row: BrokerRow) -> None:
            try:
                info = api_kv(await self.admin.instance.invoke(
                    row.addr, RemotingCommand.request(RequestCode.GET_BROKER_RUNTIME_INFO), timeout_ms))
            except (FerryError, OSError) as exc:
                row.error = f"did not answer: {type(exc).__name__}: {exc}"
                row.dead = True
                return
            row.runtime = info
            row.role = info.get("brokerRole", "")
            row.put_tps = first_rate(info.get("putTps"))
            row.get_tps = first_rate(info.get("getTransferedTps"))
            row.max_phy_offset = int(info.get("commitLogMaxOffset", "0") or 0)
            row.boot_ms = int(info.get("bootTimestamp", "0") or 0)
            controller = _json_field(info, "controllerRole")
            if isinstance(controller, dict) and "replicaId" in controller:
                row.replica_id = int(controller["replicaId"])
                row.master_epoch = int(controller.get("masterEpoch", 0) or 0)

        await asyncio.gather(*(fill(r) for r in rows))
        now = time.time()
        seen = set()
        for r in rows:
            seen.add((r.broker_name, r.addr))
            if not r.dead:
                r.last_seen_s = now
                self.known[(r.broker_name, r.addr)] = r
            elif (r.broker_name, r.addr) in self.known:
                r.last_seen_s = self.known[(r.broker_name, r.addr)].last_seen_s
                r.replica_id = self.known[(r.broker_name, r.addr)].replica_id
        for key, old in list(self.known.items()):
            if key in seen:
                continue
            if now - old.last_seen_s > DEAD_BROKER_KEPT_S:
                del self.known[key]
                continue
            rows.append(BrokerRow(old.cluster, old.broker_name, old.broker_id, old.addr, role=old.role,
                                  error="not registered with the name server: did not answer",
                                  dead=True, replica_id=old.replica_id, last_seen_s=old.last_seen_s))
        masters = {r.broker_name: r for r in rows if r.is_master and not r.dead}
        for r in rows:
            master = masters.get(r.broker_name)
            if not r.is_master and master is not None and not r.dead:
                r.lag_bytes = max(master.max_phy_offset - r.max_phy_offset, 0)
        rows.sort(key=lambda r: (r.cluster, r.broker_name, r.dead, r.broker_id, r.addr))
        return rows

    # ---- topics --------------------------------------------------------------------------------------------
    async def topics(self) -> list[str]:
        return sorted(await self.admin.topic_list())

    async def topic_queues(self, topic: str) -> list[dict[str, Any]]:
        """Per readable queue: broker, id, min and max offset, last store time (TopicNotExistError if unknown)."""
        rows = []
        for mq, lo, hi, last_ms in await self.admin.topic_status(topic):
            rows.append({"brokerName": mq.broker_name, "queueId": mq.queue_id, "minOffset": lo, "maxOffset": hi,
                         "messages": hi - lo, "lastUpdate": fmt_ms(last_ms)})
        return rows

    async def topic_config(self, topic: str) -> dict[str, Any]:
        """The topic's queue counts and permission as its route says (the first broker group)."""
        route = await self.admin.topic_route(topic)
        if not route.queue_datas:
            return {"readQueueNums": 0, "writeQueueNums": 0, "perm": 0}
        qd = route.queue_datas[0]
        return {"readQueueNums": qd.read_queue_nums, "writeQueueNums": qd.write_queue_nums, "perm": qd.perm,
                "brokers": sorted(q.broker_name for q in route.queue_datas)}

    async def topic_groups(self, topic: str) -> list[str]:
        try:
            return await ops.groups_consuming(self.admin, topic)
        except (ClientError, TopicNotExistError):
            return []

    # ---- groups --------------------------------------------------------------------------------------------
    async def group_table(self) -> dict[str, dict[str, Any]]:
        table: dict[str, dict[str, Any]] = {}
        for b in await self.admin.brokers(masters_only=True):
            try:
                resp = await self.admin.instance.invoke(b.addr, RemotingCommand.request(
                    RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG))
            except (FerryError, OSError) as exc:
                log.info("groups of %s unavailable: %s", b.addr, exc)
                continue
            found = (jsonx.loads(resp.body).get("subscriptionGroupTable") or {}) if resp.body else {}
            for name, cfg in found.items():
                table.setdefault(name, cfg)
        return table

    async def groups(self) -> list[str]:
        return sorted(n for n in await self.group_table() if n not in SYSTEM_GROUPS)

    async def group_lag(self, group: str, topic: str = "") -> list[QueueLag]:
        out: list[QueueLag] = []
        for b in await self.admin.brokers(masters_only=True):
            try:
                stats = await self.admin.consume_stats(b.addr, group, topic)
            except (FerryError, OSError) as exc:
                log.info("consume stats of %s from %s unavailable: %s", group, b.addr, exc)
                continue
            for mq, s in sorted(stats.items()):
                out.append(QueueLag(mq.topic, mq.broker_name, mq.queue_id, s["brokerOffset"], s["consumerOffset"],
                                    s["lastTimestamp"]))
        return out

    async def group_clients(self, group: str, queues: list[QueueLag]) -> list[dict[str, Any]]:
        """The group's live consumers: address, language, version, pull and consume TPS (their own report) and
        the lag of the queues each holds."""
        try:
            conns = await ops.consumer_connections(self.admin, group)
        except ClientError:
            return []
        lag_of = {f"{q.topic}/{q.broker_name}/{q.queue_id}": q.lag for q in queues}
        rows: list[dict[str, Any]] = []
        seen: set[str] = set()
        for c in conns["connections"]:
            if c["clientId"] in seen:
                continue
            seen.add(c["clientId"])
            row = dict(c, pullTps=0.0, consumeOkTps=0.0, consumeFailedTps=0.0, queues=0, lag=0, error="")
            try:
                info = await ops_more.consumer_running_info(self.admin, group, c["clientId"])
            except (FerryError, OSError) as exc:
                row["error"] = str(exc)
                rows.append(row)
                continue
            for status in (info.get("statusTable") or {}).values():
                row["pullTps"] += float(status.get("pullTPS", 0) or 0)
                row["consumeOkTps"] += float(status.get("consumeOKTPS", 0) or 0)
                row["consumeFailedTps"] += float(status.get("consumeFailedTPS", 0) or 0)
            held = list((info.get("mqTable") or {}).keys())
            row["queues"] = len(held)
            row["lag"] = sum(lag_of.get(k, 0) for k in held)
            rows.append(row)
        return rows

    async def has_dlq(self, group: str) -> bool:
        try:
            await self.admin.topic_route(dlq_topic(group))
        except TopicNotExistError:
            return False
        return True

    async def dlq_messages(self, group: str) -> list[MessageExt]:
        """The newest dead-lettered messages of ``group`` (up to ``MESSAGES_SHOWN_MAX``); [] when it has none."""
        try:
            return [m async for m in ops_admin.messages_in_range(self.admin, dlq_topic(group),
                                                                   limit=MESSAGES_SHOWN_MAX)]
        except (TopicNotExistError, ClientError):
            return []

    # ---- producers -----------------------------------------------------------------------------------------
    async def producers(self) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = []
        for b in await self.admin.brokers():
            try:
                found = await ops_more.all_producers(self.admin, b.addr)
            except (FerryError, OSError) as exc:
                rows.append({"broker": b.broker_name, "brokerAddr": b.addr, "error": str(exc)})
                continue
            for p in found:
                rows.append({"broker": b.broker_name, "brokerAddr": b.addr, "group": p.get("group", ""),
                             "clientId": p.get("clientId", ""), "clientAddr": p.get("remoteIP", p.get("clientAddr", "")),
                             "language": p.get("language", ""), "version": p.get("version", ""),
                             "lastUpdate": fmt_ms(p.get("lastUpdateTimestamp")), "error": ""})
        return rows

    # ---- messages ------------------------------------------------------------------------------------------
    async def find_messages(self, msg_id: str | None, topic: str | None, key: str | None,
                            begin_ms: int = 0, end_ms: int | None = None) -> list[MessageExt]:
        if msg_id:
            return [await self.admin.find_message(msg_id, topic or None)]
        assert topic
        if key:
            return await self.admin.query_messages_by_key(topic, key, MESSAGES_SHOWN_MAX, begin_ms, end_ms)
        return [m async for m in ops_admin.messages_in_range(self.admin, topic, begin_ms=begin_ms, end_ms=end_ms,
                                                               limit=MESSAGES_SHOWN_MAX)]

    async def consumption_states(self, messages: list[MessageExt]) -> dict[str, dict[str, str]]:
        """For each message (by offset msgId), each group consuming its topic: ``consumed`` when the group's
        committed offset of the message's queue is past it, ``not consumed`` otherwise (``no offset`` when
        the group has committed nothing there). One consume-stats call per (topic, group, master)."""
        out: dict[str, dict[str, str]] = {m.offset_msg_id: {} for m in messages}
        brokers = await self.admin.brokers() if messages else []
        for topic in sorted({m.topic for m in messages}):
            groups = await self.topic_groups(topic)
            committed: dict[str, dict[tuple[str, int], int]] = {}
            for group in groups:
                if group in SYSTEM_GROUPS:
                    continue
                committed[group] = {(q.broker_name, q.queue_id): q.consumer_offset
                                    for q in await self.group_lag(group, topic)}
            for m in messages:
                if m.topic != topic:
                    continue
                broker_name = broker_of(m, brokers)
                for group, offsets in committed.items():
                    offset = offsets.get((broker_name, m.queue_id))
                    if offset is None or offset < 0:
                        state = "no offset"
                    else:
                        state = "consumed" if offset > m.queue_offset else "not consumed"
                    out[m.offset_msg_id][group] = state
        return out

    # ---- config, HA, controller ----------------------------------------------------------------------------
    async def broker_config(self, broker_addr: str) -> dict[str, str]:
        return await ops.broker_config(self.admin, broker_addr)

    async def controller(self) -> ControllerAdmin | None:
        """An admin client of the controllers (``--controller``, else the ``controllerAddr`` a broker in
        controller mode is configured with); None outside controller mode."""
        addrs = self.controller_addrs or self._found_controller_addrs
        if not addrs:
            for r in self.known.values():
                if r.replica_id is not None and not r.dead:
                    try:
                        addrs = (await self.broker_config(r.addr)).get("controllerAddr", "")
                    except (FerryError, OSError):
                        continue
                    if addrs:
                        self._found_controller_addrs = addrs
                        break
        if not addrs:
            return None
        try:
            return ControllerAdmin(parse_addrs(addrs))
        except ClientError:
            return None

    async def controller_groups(self) -> tuple[list[dict[str, Any]], dict[str, Any], str]:
        """(SyncStateSet data per broker group, Raft metadata, error) from the controllers; ([], {}, "") outside
        controller mode."""
        admin = await self.controller()
        if admin is None:
            return [], {}, ""
        try:
            groups = await admin.sync_state_data()
            try:
                meta = await admin.metadata()
            except FerryError as exc:
                meta = {"error": str(exc)}
            return groups, meta, ""
        except FerryError as exc:
            return [], {}, str(exc)
        finally:
            await admin.close()

    # ---- overview ------------------------------------------------------------------------------------------
    async def overview(self) -> dict[str, Any]:
        brokers = await self.brokers()
        topics = await self.topics()
        user_topics = [t for t in topics if not t.startswith((RETRY_GROUP_TOPIC_PREFIX, DLQ_GROUP_TOPIC_PREFIX))]
        groups = await self.groups()
        # the lag of every group as last sampled (the sampler already asks every master; a page view does not)
        latest = self.samples.latest()
        totals = sorted(((latest[f"lag {g}"], g) for g in groups if f"lag {g}" in latest), key=lambda t: (-t[0], t[1]))
        group_rows = [{"group": g, "lag": int(lag)} for lag, g in totals]
        dlq_groups = [t[len(DLQ_GROUP_TOPIC_PREFIX):] for t in topics if t.startswith(DLQ_GROUP_TOPIC_PREFIX)]
        return {"brokers": brokers, "alive": sum(1 for b in brokers if not b.dead),
                "dead": [b for b in brokers if b.dead], "topics": len(user_topics), "groups": len(groups),
                "putTps": sum(b.put_tps for b in brokers if not b.dead),
                "getTps": sum(b.get_tps for b in brokers if not b.dead),
                "topLag": group_rows[:OVERVIEW_GROUPS_SHOWN], "sampled": bool(self.samples.points),
                "dlqGroups": dlq_groups,
                "nameServers": list(self.admin.config.name_servers)}

    # ---- samples -------------------------------------------------------------------------------------------
    async def sample_once(self) -> None:
        values: dict[str, float] = {}
        unknown: set[str] = set()
        for r in await self.brokers(timeout_ms=SAMPLE_CALL_TIMEOUT_MS):
            label = f"{r.broker_name}/{r.shown_id}"
            names = (f"putTps {label}", f"getTps {label}") + (() if r.is_master else (f"replicaLagBytes {label}",))
            if r.dead:
                for name in names:  # the last known value, marked: a hung broker leaves no gap, but a marker
                    last = self.samples.last(name)
                    if last is not None:
                        values[name] = last
                        unknown.add(name)
                continue
            values[f"putTps {label}"] = r.put_tps
            values[f"getTps {label}"] = r.get_tps
            if r.lag_bytes is not None:
                values[f"replicaLagBytes {label}"] = float(r.lag_bytes)
        for group in await self.groups():
            values[f"lag {group}"] = float(sum(q.lag for q in await self.group_lag(group)))
        self.samples.add(time.time(), values, frozenset(unknown))

    async def sample_forever(self, interval_s: float = SAMPLE_INTERVAL_S) -> None:
        while True:
            try:
                await self.sample_once()
            except (FerryError, OSError) as exc:
                log.info("sample skipped: %s", exc)
            await asyncio.sleep(interval_s)


def api_kv(resp: RemotingCommand) -> dict[str, str]:
    return api.parse_kv_table(resp)


def broker_of(msg: MessageExt, brokers: list[Any]) -> str:
    """The broker group that stored ``msg`` (by its store host; "" when no registered broker has it)."""
    ip, port = bytes_to_host(msg.store_host)
    host = f"{ip}:{port}"
    for b in brokers:
        if b.addr == host:
            return str(b.broker_name)
    return ""


def resend_target(msg: MessageExt, group: str, to_original: bool) -> str:
    """Where a dead-lettered message of ``group`` goes again: its original topic (RETRY_TOPIC) or the group's
    retry topic."""
    if to_original:
        original = msg.properties.get(PROPERTY_RETRY_TOPIC, "")
        if not original:
            raise ClientError("the message does not name its original topic (no RETRY_TOPIC property)")
        return original
    return RETRY_GROUP_TOPIC_PREFIX + group


def resend_properties(msg: MessageExt) -> dict[str, str]:
    return {k: v for k, v in msg.properties.items() if k not in RESEND_DROPPED_PROPERTIES}


def queue_key(mq: MessageQueue) -> str:
    return f"{mq.topic}/{mq.broker_name}/{mq.queue_id}"
