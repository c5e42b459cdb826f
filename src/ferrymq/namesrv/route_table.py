"""The name server's route registry (protocol §3.1, §3.3, §6.7, §7). Pure state: no I/O, injected clock.

Tables (all keyed by strings from the wire):

| table                 | key          | value                                                  |
|-----------------------|--------------|--------------------------------------------------------|
| ``_topic_queues``     | topic        | {brokerName: _Queues(read, write, perm, sysFlag)}  (only from brokerId-0 registrations) |
| ``_broker_topics``    | brokerName   | {topic} having QueueData of that brokerName (reverse index) |
| ``_brokers``          | brokerName   | BrokerData(cluster, brokerName, {brokerId: addr})      |
| ``_clusters``         | clusterName  | {brokerName}                                           |
| ``_cluster_topics``   | clusterName  | {topic: number of its broker names with QueueData of it} |
| ``_live``             | broker addr  | BrokerLiveInfo(last update, data version, haServerAddr, channel), |
|                       |              | in order of last update (oldest first: the expiry scan's queue) |
| ``_addr_slot``        | broker addr  | (brokerName, brokerId) the address currently fills     |
| ``_channel_addrs``    | channel      | {broker addr} registered over that connection         |
| ``_filter_servers``   | broker addr  | [filter server addr]                                   |

A broker group removed in steps is "retiring" (``_retiring``: brokerName -> (cluster, topics left)): it has
no BrokerData and no cluster membership at once, routes leave its QueueData out, and ``drain_retired`` removes
the QueueData and the cluster-index counts a step at a time (the app calls it from a task when ``on_retire``
fires). A group that registers again while retiring first finishes its retirement.

Invariants: every address in a BrokerData has one ``_addr_slot`` entry and one ``_live`` entry; a
brokerName with no addresses has no BrokerData, no cluster membership and no QueueData; a topic with no
QueueData has no entry. The QueueData of the tables are plain tuples of ints (``_Queues``), which the garbage
collector stops tracking, so a full collection never walks the estate's 100,000s of entries (a full
collection over them held the loop ~40 ms at 1,000 brokers x 100 topics); routes are built from them on
demand. The name indexes (``_broker_topics``, ``_clusters``, ``_channel_addrs``) are dicts of names to None, not
sets, for the same reason: a full pass untracks a dict of strings and skips it, but walks every entry of a set
(one per broker x topic in ``_broker_topics``). The indexes keep every operation's cost to what it touches, never the whole estate:

| operation                          | cost                                                        |
|------------------------------------|-------------------------------------------------------------|
| register, version unchanged        | O(1)                                                        |
| register, version changed / first  | O(topics in the body); ``upsert_topics`` lets the caller split it into steps |
| route of a topic                   | O(brokers serving the topic)                                |
| topics of a cluster                | O(topics of the cluster) (the answer's size)                |
| remove a broker (unregister, close, expiry) | O(topics of that broker), in steps of ``REMOVE_STEP_TOPICS`` when there are more than ``REMOVE_INLINE_MAX_TOPICS`` and ``on_retire`` is set |
| expiry scan                        | O(expired brokers + 1): ``_live`` is kept in last-update order |

A "channel" is any hashable token for the connection a registration arrived on (the app passes its
Connection); when the channel closes every broker registered over it is removed at once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field
from typing import Any

from ferrymq.common.route import MASTER_ID, BrokerData, QueueData, TopicRouteData
from ferrymq.common.topic import PERM_READ, PERM_WRITE, DataVersion, TopicConfig

log = logging.getLogger(__name__)

#: A broker not heard from for longer than this is removed (BROKER_CHANNEL_EXPIRED_TIME).
BROKER_CHANNEL_EXPIRED_MS = 120_000
#: How often the app scans for expired brokers.
SCAN_NOT_ACTIVE_BROKER_INTERVAL_MS = 10_000
#: Delay of the first scan after start.
SCAN_NOT_ACTIVE_BROKER_FIRST_DELAY_MS = 5_000
#: Brokers one call of the expiry scan removes at most (the app calls again at once while there are more).
EXPIRY_SCAN_BATCH = 50
#: A removed broker group with more topics than this has its QueueData removed in steps (when on_retire is set).
REMOVE_INLINE_MAX_TOPICS = 2_000
#: Topics one ``drain_retired`` step removes.
REMOVE_STEP_TOPICS = 1_000

ClockMs = Callable[[], int]


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(slots=True)
class BrokerLiveInfo:
    last_update_ms: int
    data_version: DataVersion | None
    ha_server_addr: str
    channel: Hashable | None = None


@dataclass(frozen=True, slots=True)
class RegisterBrokerResult:
    """What a registering slave learns about its master (both None for a master or a masterless slave)."""

    ha_server_addr: str | None = None
    master_addr: str | None = None


@dataclass(frozen=True, slots=True)
class RemovedBroker:
    addr: str
    channel: Hashable | None


#: One broker group's queues of one topic as stored: (readQueueNums, writeQueueNums, perm, topicSysFlag), a
#: QueueData without the brokerName. An exact tuple (not a NamedTuple) so the garbage collector untracks it.
_Queues = tuple[int, int, int, int]
_PERM_INDEX = 2


@dataclass(slots=True)
class _Slot:
    broker_name: str
    broker_id: int


@dataclass(slots=True, eq=False)
class RouteTable:
    clock_ms: ClockMs = wall_clock_ms
    broker_expired_ms: int = BROKER_CHANNEL_EXPIRED_MS
    _topic_queues: dict[str, dict[str, _Queues]] = field(init=False, repr=False, default_factory=dict)
    _broker_topics: dict[str, dict[str, None]] = field(init=False, repr=False, default_factory=dict)
    _brokers: dict[str, BrokerData] = field(init=False, repr=False, default_factory=dict)
    _clusters: dict[str, dict[str, None]] = field(init=False, repr=False, default_factory=dict)
    _cluster_topics: dict[str, dict[str, int]] = field(init=False, repr=False, default_factory=dict)
    _live: dict[str, BrokerLiveInfo] = field(init=False, repr=False, default_factory=dict)
    _addr_slot: dict[str, _Slot] = field(init=False, repr=False, default_factory=dict)
    _channel_addrs: dict[Hashable, dict[str, None]] = field(init=False, repr=False, default_factory=dict)
    _filter_servers: dict[str, list[str]] = field(init=False, repr=False, default_factory=dict)
    _retiring: dict[str, tuple[str, list[str]]] = field(init=False, repr=False, default_factory=dict)
    #: called when a removed broker group's QueueData is left for ``drain_retired`` (None: removed inline)
    on_retire: Callable[[], None] | None = field(default=None, repr=False)

    def counts(self) -> dict[str, int]:
        """Sizes of the tables (the name server's metrics)."""
        return {"clusters": len(self._clusters), "broker_groups": len(self._brokers),
                "live_brokers": len(self._live), "topics": len(self._topic_queues)}

    # ---- registration ------------------------------------------------------------------
    def register_broker(
        self,
        cluster: str,
        broker_addr: str,
        broker_name: str,
        broker_id: int,
        ha_server_addr: str = "",
        *,
        data_version: DataVersion | None = None,
        topic_configs: Iterable[TopicConfig] | None = None,
        filter_servers: Iterable[str] = (),
        channel: Hashable | None = None,
    ) -> RegisterBrokerResult:
        """Record (or refresh) one broker address. QueueData changes only for brokerId 0, and only when the
        DataVersion changed or this address newly fills the slot."""
        now_ms = self.clock_ms()
        self._vacate_other_slot(broker_addr, broker_name, broker_id)
        self._join_cluster(cluster, broker_name)

        if broker_name in self._retiring:  # registered again before its old QueueData was all gone
            self._finish_retiring(broker_name)
        brokers = self._brokers.get(broker_name)
        first = brokers is None
        if brokers is None:
            brokers = self._brokers[broker_name] = BrokerData(cluster, broker_name, {})
            log.info("new broker group %s in cluster %s", broker_name, cluster)
        old_addr = brokers.broker_addrs.get(broker_id)
        first = first or old_addr is None or old_addr != broker_addr
        if old_addr is not None and old_addr != broker_addr:
            self._forget_addr(old_addr)  # another process took over this id: drop the old one's liveness
        brokers.broker_addrs[broker_id] = broker_addr
        self._addr_slot[broker_addr] = _Slot(broker_name, broker_id)

        if broker_id == MASTER_ID and topic_configs is not None:
            if first or self._version_changed(broker_addr, data_version):
                self.upsert_topics(broker_name, topic_configs)

        prev = self._live.get(broker_addr)
        if prev is None:
            log.info("broker registered: %s id=%d addr=%s ha=%s", broker_name, broker_id, broker_addr,
                     ha_server_addr)
        if prev is not None and prev.channel is not None and prev.channel != channel:
            self._unlink_channel(prev.channel, broker_addr)
        self._live.pop(broker_addr, None)  # re-inserted last: _live stays in last-update order
        self._live[broker_addr] = BrokerLiveInfo(now_ms, data_version, ha_server_addr, channel)
        if channel is not None:
            self._channel_addrs.setdefault(channel, {})[broker_addr] = None
        filters = list(filter_servers)
        if filters:
            self._filter_servers[broker_addr] = filters
        else:
            self._filter_servers.pop(broker_addr, None)

        if broker_id != MASTER_ID:
            master_addr = brokers.broker_addrs.get(MASTER_ID)
            master_live = self._live.get(master_addr) if master_addr is not None else None
            if master_addr is not None and master_live is not None:
                return RegisterBrokerResult(master_live.ha_server_addr, master_addr)
        return RegisterBrokerResult()

    def topics_wanted(self, broker_addr: str, broker_name: str, broker_id: int,
                      data_version: DataVersion | None) -> bool:
        """Whether a registration of this address with ``data_version`` would apply its topic table: a master
        (brokerId 0) that newly fills its slot or whose DataVersion changed (RocketMQ skips unchanged tables)."""
        if broker_id != MASTER_ID:
            return False
        bd = self._brokers.get(broker_name)
        if bd is None or bd.broker_addrs.get(broker_id) != broker_addr:
            return True
        return self._version_changed(broker_addr, data_version)

    def upsert_topics(self, broker_name: str, topic_configs: Iterable[TopicConfig]) -> int:
        """Create or update the QueueData of ``broker_name`` for each topic (one step of a registration; the
        caller may split a large table into several calls). Returns the number of topics seen."""
        bd = self._brokers.get(broker_name)
        if bd is None:
            return 0
        cluster_topics = self._cluster_topics.setdefault(bd.cluster, {})
        own = self._broker_topics.setdefault(broker_name, {})
        n = 0
        for tc in topic_configs:
            n += 1
            name = tc.topic_name
            queues = self._topic_queues.get(name)
            if queues is None:
                queues = self._topic_queues[name] = {}
                log.debug("new topic route %s on %s", name, broker_name)
            new = (tc.read_queue_nums, tc.write_queue_nums, tc.perm, tc.topic_sys_flag)
            if queues.get(broker_name) != new:
                queues[broker_name] = new
            if name not in own:
                own[name] = None
                cluster_topics[name] = cluster_topics.get(name, 0) + 1
        return n

    def master_channel(self, broker_name: str) -> Hashable | None:
        """The connection the master of ``broker_name`` registered over (None: no live master)."""
        bd = self._brokers.get(broker_name)
        addr = bd.broker_addrs.get(MASTER_ID) if bd is not None else None
        live = self._live.get(addr) if addr is not None else None
        return live.channel if live is not None else None

    def finish_registration(self, broker_addr: str, data_version: DataVersion | None,
                            filter_servers: Iterable[str] = ()) -> None:
        """Record the DataVersion whose table is now fully applied (after the steps of ``upsert_topics``),
        and the filter servers that came after the table in the body."""
        live = self._live.get(broker_addr)
        if live is None:
            return
        live.data_version = data_version
        filters = list(filter_servers)
        if filters:
            self._filter_servers[broker_addr] = filters
        else:
            self._filter_servers.pop(broker_addr, None)

    def unregister_broker(self, cluster: str, broker_addr: str, broker_name: str, broker_id: int) -> bool:
        """Clean-shutdown removal of one (brokerName, brokerId); only if that slot holds ``broker_addr``."""
        slot = self._addr_slot.get(broker_addr)
        if slot is None or slot.broker_name != broker_name or slot.broker_id != broker_id:
            return False
        log.info("broker unregistered: %s id=%d addr=%s cluster=%s", broker_name, broker_id, broker_addr, cluster)
        self._remove_addr(broker_addr)
        return True

    def query_data_version(self, broker_addr: str, data_version: DataVersion) -> tuple[bool, DataVersion | None]:
        """(changed, version the name server holds). An unchanged version refreshes the broker's liveness."""
        changed = self._version_changed(broker_addr, data_version)
        live = self._live.get(broker_addr)
        if not changed and live is not None:
            live.last_update_ms = self.clock_ms()
            self._live[broker_addr] = self._live.pop(broker_addr)  # keep _live in last-update order
        return changed, live.data_version if live is not None else None

    # ---- liveness ----------------------------------------------------------------------
    def on_channel_closed(self, channel: Hashable) -> list[str]:
        """Remove every broker registered over ``channel`` at once. Returns the removed addresses."""
        addrs = self._channel_addrs.pop(channel, {})
        removed = []
        for addr in sorted(addrs):
            live = self._live.get(addr)
            if live is not None and live.channel == channel:
                log.info("broker connection closed, removing %s", addr)
                self._remove_addr(addr)
                removed.append(addr)
        return removed

    def scan_not_active_brokers(self, max_count: int | None = None) -> list[RemovedBroker]:
        """Remove brokers silent for more than ``broker_expired_ms`` (at most ``max_count`` of them); the
        caller closes their channels. Reads only the expired entries and the first live one (``_live`` is in
        last-update order); an entry refreshed under a clock that stepped back may expire one scan late."""
        now_ms = self.clock_ms()
        expired = []
        for addr, live in self._live.items():
            if now_ms - live.last_update_ms <= self.broker_expired_ms:
                break
            expired.append(RemovedBroker(addr, live.channel))
            if max_count is not None and len(expired) >= max_count:
                break
        for gone in expired:
            log.warning("broker %s expired: no registration for %d ms", gone.addr, self.broker_expired_ms)
            self._remove_addr(gone.addr)
        return expired

    # ---- admin -------------------------------------------------------------------------
    def wipe_write_perm(self, broker_name: str) -> int:
        """Clear PERM_WRITE on every topic of ``broker_name``; returns the number of topics touched."""
        return self._update_perm(broker_name, lambda perm: perm & ~PERM_WRITE)

    def add_write_perm(self, broker_name: str) -> int:
        """Give every topic of ``broker_name`` read and write permission back; returns the count."""
        return self._update_perm(broker_name, lambda perm: perm | PERM_READ | PERM_WRITE)

    def delete_topic(self, topic: str, cluster: str | None = None) -> bool:
        """Drop the topic's QueueData (only that of ``cluster``'s brokers when given). True if anything went."""
        queues = self._topic_queues.get(topic)
        if queues is None:
            return False
        if cluster:
            names = [n for n in queues if n in self._clusters.get(cluster, ())]
        else:
            names = list(queues)
        for name in names:
            del queues[name]
            self._drop_broker_topic(name, topic)
        if not queues:
            del self._topic_queues[topic]
        return bool(names)

    # ---- queries -----------------------------------------------------------------------
    def get_topic_route(self, topic: str) -> TopicRouteData | None:
        """The route of ``topic``, or None when it has no QueueData or no live broker group."""
        queues = self._topic_queues.get(topic)
        if not queues:
            return None
        queue_datas = []
        broker_datas = []
        for name, qd in queues.items():
            if name in self._retiring:
                continue
            queue_datas.append(QueueData(name, *qd))
            bd = self._brokers.get(name)
            if bd is not None:
                broker_datas.append(BrokerData(bd.cluster, bd.broker_name, dict(bd.broker_addrs)))
        if not broker_datas:
            return None
        return TopicRouteData(queue_datas=queue_datas, broker_datas=broker_datas)

    def filter_servers_of(self, addrs: Iterable[str]) -> dict[str, list[str]]:
        return {a: list(self._filter_servers[a]) for a in addrs if a in self._filter_servers}

    def cluster_info(self) -> dict[str, Any]:
        """ClusterInfo JSON object (§3.5)."""
        return {
            "brokerAddrTable": {name: bd.to_json() for name, bd in sorted(self._brokers.items())},
            "clusterAddrTable": {c: sorted(names) for c, names in sorted(self._clusters.items())},
        }

    def all_topics(self) -> list[str]:
        return sorted(self._topic_queues)

    def topics_by_cluster(self, cluster: str) -> list[str]:
        return sorted(self._cluster_topics.get(cluster, ()))

    def broker_data(self, broker_name: str) -> BrokerData | None:
        bd = self._brokers.get(broker_name)
        return None if bd is None else BrokerData(bd.cluster, bd.broker_name, dict(bd.broker_addrs))

    def live_info(self, broker_addr: str) -> BrokerLiveInfo | None:
        return self._live.get(broker_addr)

    def live_addrs(self) -> list[str]:
        return sorted(self._live)

    def clusters(self) -> dict[str, list[str]]:
        return {c: sorted(names) for c, names in self._clusters.items()}

    def queue_data(self, topic: str, broker_name: str) -> QueueData | None:
        qd = self._topic_queues.get(topic, {}).get(broker_name)
        return None if qd is None else QueueData(broker_name, *qd)

    # ---- internals ---------------------------------------------------------------------
    def _version_changed(self, broker_addr: str, data_version: DataVersion | None) -> bool:
        live = self._live.get(broker_addr)
        return live is None or live.data_version != data_version

    def _update_perm(self, broker_name: str, change: Callable[[int], int]) -> int:
        count = 0
        for topic in self._broker_topics.get(broker_name, ()):
            queues = self._topic_queues[topic]
            qd = queues[broker_name]
            queues[broker_name] = (qd[0], qd[1], change(qd[_PERM_INDEX]), qd[3])
            count += 1
        return count

    def _join_cluster(self, cluster: str, broker_name: str) -> None:
        bd = self._brokers.get(broker_name)
        if bd is not None and bd.cluster != cluster:  # a broker group moved to another cluster
            self._leave_cluster(bd.cluster, broker_name)
            own = self._broker_topics.get(broker_name, ())
            for topic in own:
                self._uncount_cluster_topic(bd.cluster, topic)
            cluster_topics = self._cluster_topics.setdefault(cluster, {})
            for topic in own:
                cluster_topics[topic] = cluster_topics.get(topic, 0) + 1
            bd.cluster = cluster
        self._clusters.setdefault(cluster, {})[broker_name] = None

    def _leave_cluster(self, cluster: str, broker_name: str) -> None:
        names = self._clusters.get(cluster)
        if names is not None:
            names.pop(broker_name, None)
            if not names:
                del self._clusters[cluster]

    def _vacate_other_slot(self, broker_addr: str, broker_name: str, broker_id: int) -> None:
        """An address re-registering under another id (slave<->master switch) or another brokerName first
        loses its old entry."""
        slot = self._addr_slot.get(broker_addr)
        if slot is None or (slot.broker_name == broker_name and slot.broker_id == broker_id):
            return
        log.info("broker %s moves from %s/%d to %s/%d", broker_addr, slot.broker_name, slot.broker_id,
                 broker_name, broker_id)
        del self._addr_slot[broker_addr]
        bd = self._brokers.get(slot.broker_name)
        if bd is None:
            return
        if bd.broker_addrs.get(slot.broker_id) == broker_addr:
            del bd.broker_addrs[slot.broker_id]
        if not bd.broker_addrs and slot.broker_name != broker_name:
            self._remove_broker_name(slot.broker_name)

    def _forget_addr(self, addr: str) -> None:
        """Drop the liveness bookkeeping of an address that no longer fills any slot."""
        self._addr_slot.pop(addr, None)
        self._filter_servers.pop(addr, None)
        live = self._live.pop(addr, None)
        if live is not None and live.channel is not None:
            self._unlink_channel(live.channel, addr)

    def _unlink_channel(self, channel: Hashable, addr: str) -> None:
        addrs = self._channel_addrs.get(channel)
        if addrs is not None:
            addrs.pop(addr, None)
            if not addrs:
                del self._channel_addrs[channel]

    def _remove_addr(self, addr: str) -> None:
        slot = self._addr_slot.get(addr)
        self._forget_addr(addr)
        if slot is None:
            return
        bd = self._brokers.get(slot.broker_name)
        if bd is None:
            return
        if bd.broker_addrs.get(slot.broker_id) == addr:
            del bd.broker_addrs[slot.broker_id]
        if not bd.broker_addrs:
            self._remove_broker_name(slot.broker_name)

    def _remove_broker_name(self, broker_name: str) -> None:
        """The group lost its last address: its cluster membership and all its QueueData go (in steps for a
        large group when ``on_retire`` is set)."""
        bd = self._brokers.pop(broker_name, None)
        cluster = bd.cluster if bd is not None else ""
        if bd is not None:
            self._leave_cluster(cluster, broker_name)
        topics = list(self._broker_topics.pop(broker_name, ()))
        log.info("broker group %s removed", broker_name)
        if len(topics) > REMOVE_INLINE_MAX_TOPICS and self.on_retire is not None:
            self._retiring[broker_name] = (cluster, topics)
            self.on_retire()
            return
        self._drop_queue_data(broker_name, cluster, topics)

    def drain_retired(self, max_topics: int = REMOVE_STEP_TOPICS) -> bool:
        """Remove up to ``max_topics`` QueueData of retiring broker groups; True while some are left."""
        budget = max_topics
        while self._retiring and budget > 0:
            name = next(iter(self._retiring))
            cluster, topics = self._retiring[name]
            step = topics[-budget:]
            del topics[-budget:]
            budget -= len(step)
            self._drop_queue_data(name, cluster, step)
            if not topics:
                del self._retiring[name]
        return bool(self._retiring)

    def _finish_retiring(self, broker_name: str) -> None:
        cluster, topics = self._retiring.pop(broker_name)
        self._drop_queue_data(broker_name, cluster, topics)

    def _drop_queue_data(self, broker_name: str, cluster: str, topics: Iterable[str]) -> None:
        for topic in topics:
            if cluster:
                self._uncount_cluster_topic(cluster, topic)
            queues = self._topic_queues.get(topic)
            if queues is None:
                continue
            queues.pop(broker_name, None)
            if not queues:
                del self._topic_queues[topic]
                log.debug("topic %s removed: no broker serves it", topic)

    def _drop_broker_topic(self, broker_name: str, topic: str) -> None:
        topics = self._broker_topics.get(broker_name)
        if topics is not None and topic in topics:
            del topics[topic]
            bd = self._brokers.get(broker_name)
            if bd is not None:
                self._uncount_cluster_topic(bd.cluster, topic)
            if not topics:
                del self._broker_topics[broker_name]

    def _uncount_cluster_topic(self, cluster: str, topic: str) -> None:
        counts = self._cluster_topics.get(cluster)
        if counts is None:
            return
        left = counts.get(topic, 0) - 1
        if left > 0:
            counts[topic] = left
        else:
            counts.pop(topic, None)
            if not counts:
                del self._cluster_topics[cluster]
