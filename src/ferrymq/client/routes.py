"""Route data → queue lists and broker addresses (pure, no I/O; protocol §3.1, §6.10).

* publish queues: writable QueueData whose broker group has a master (id 0); ``writeQueueNums`` each.
* subscribe queues: readable QueueData, ``readQueueNums`` each, whether or not the master is alive
  (a slave-only broker group is still readable).
* broker address for a pull: the suggested id if present, else the lowest id present (the master, or the
  lowest slave when the master is gone).
"""

from __future__ import annotations

from ferrymq.common.route import MASTER_ID, BrokerData, MessageQueue, TopicRouteData
from ferrymq.common.topic import is_readable, is_writeable


def _order_conf(route: TopicRouteData) -> list[tuple[str, int]]:
    out: list[tuple[str, int]] = []
    for item in (route.order_topic_conf or "").split(";"):
        name, _, num = item.partition(":")
        if name and num.strip().isdigit():
            out.append((name.strip(), int(num)))
    return out


def _order_queues(topic: str, route: TopicRouteData) -> list[MessageQueue]:
    """The queues an orderTopicConf names (``broker:n;...``): for sending and reading alike."""
    return [MessageQueue(topic, name, i) for name, n in _order_conf(route) for i in range(n)]


def publish_queues(topic: str, route: TopicRouteData, *, max_queue_nums: int | None = None) -> list[MessageQueue]:
    """Queues a producer may send to (masters only). ``max_queue_nums`` caps each broker (TBW102 fallback)."""
    if route.order_topic_conf:
        return _order_queues(topic, route)
    mqs: list[MessageQueue] = []
    for qd in sorted(route.queue_datas, key=lambda q: q.broker_name):
        if not is_writeable(qd.perm):
            continue
        bd = route.broker(qd.broker_name)
        if bd is None or bd.master_addr() is None:
            continue
        n = qd.write_queue_nums if max_queue_nums is None else min(qd.write_queue_nums, max_queue_nums)
        mqs.extend(MessageQueue(topic, qd.broker_name, i) for i in range(n))
    return mqs


def subscribe_queues(topic: str, route: TopicRouteData) -> list[MessageQueue]:
    """Queues a consumer reads (masters or slaves)."""
    if route.order_topic_conf:
        return _order_queues(topic, route)
    mqs: list[MessageQueue] = []
    for qd in sorted(route.queue_datas, key=lambda q: q.broker_name):
        if not is_readable(qd.perm):
            continue
        if route.broker(qd.broker_name) is None:
            continue
        mqs.extend(MessageQueue(topic, qd.broker_name, i) for i in range(qd.read_queue_nums))
    return mqs


def pick_addr(addrs: dict[int, str], broker_id: int = MASTER_ID, *, only_this: bool = False) -> tuple[str, int] | None:
    """(address, id): the exact id if present, else (unless ``only_this``) the lowest id present."""
    if broker_id in addrs:
        return addrs[broker_id], broker_id
    if only_this or not addrs:
        return None
    lowest = min(addrs)
    return addrs[lowest], lowest


def broker_table(route: TopicRouteData) -> dict[str, dict[int, str]]:
    return {bd.broker_name: dict(bd.broker_addrs) for bd in route.broker_datas}


def all_addrs(brokers: list[BrokerData], *, masters_only: bool = False) -> list[str]:
    out: list[str] = []
    for bd in brokers:
        for bid, addr in sorted(bd.broker_addrs.items()):
            if masters_only and bid != MASTER_ID:
                continue
            if addr not in out:
                out.append(addr)
    return out
