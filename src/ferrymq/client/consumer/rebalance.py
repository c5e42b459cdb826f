"""Queue allocation strategies (pure). Every consumer of a group computes the same answer from the
same sorted inputs, so no coordination is needed."""

from __future__ import annotations

from collections.abc import Sequence

from ferrymq.common.route import MessageQueue


def allocate_averagely(consumer_group: str, current_cid: str, mqs: Sequence[MessageQueue],
                       cids: Sequence[str]) -> list[MessageQueue]:
    """Contiguous ranges: the first ``len(mqs) % len(cids)`` consumers get one extra queue.
    Inputs are sorted here; a consumer not in ``cids`` gets nothing."""
    mq_all = sorted(mqs)
    cid_all = sorted(cids)
    if current_cid not in cid_all or not mq_all:
        return []
    index = cid_all.index(current_cid)
    n_mq, n_cid = len(mq_all), len(cid_all)
    mod = n_mq % n_cid
    if n_mq <= n_cid:
        average = 1
    elif mod > 0 and index < mod:
        average = n_mq // n_cid + 1
    else:
        average = n_mq // n_cid
    start = index * average if (mod > 0 and index < mod) else index * average + mod
    count = min(average, n_mq - start)
    return [mq_all[(start + i) % n_mq] for i in range(max(count, 0))]


def allocate_averagely_by_circle(consumer_group: str, current_cid: str, mqs: Sequence[MessageQueue],
                                 cids: Sequence[str]) -> list[MessageQueue]:
    """Round-robin dealing: queue i goes to consumer i % n."""
    mq_all = sorted(mqs)
    cid_all = sorted(cids)
    if current_cid not in cid_all:
        return []
    index = cid_all.index(current_cid)
    return [mq for i, mq in enumerate(mq_all) if i % len(cid_all) == index]
