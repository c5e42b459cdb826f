"""Auto-renewal of received messages (ReceiveMessage with ``auto_renew``, sent by 5.x PushConsumers); sans-IO.

A PushConsumer names no invisible duration: the proxy hides what it hands out for ``auto_renew_invisible_ms``
and keeps each message hidden while its client works on it, as RocketMQ's proxy does (its
DefaultReceiptHandleManager): ``renew_ahead_ms`` before a message would become visible again, its invisible
time is moved ``auto_renew_invisible_ms`` further. One record per message held for renewal:

| held field    | meaning                                                                                       |
|---------------|-----------------------------------------------------------------------------------------------|
| client_id     | the client that received it (``x-mq-client-id``): its end stops the renewal                    |
| key           | the pop queue (group, topic, broker name, queue id)                                             |
| queue_offset  | the pop entry in that queue                                                                    |
| serial        | the delivery renewed; the entry acked, changed (ChangeInvisibleDuration) or delivered again carries another serial (or is gone): renewal ends |
| received_ms   | when it was delivered: it is not renewed beyond ``renew_max_ms`` after that                     |
| renew_at_ms   | when it is renewed next (its heap position)                                                     |

A renewal moves the entry's ``visible_at_ms`` and keeps its serial, so the receipt handle the client got with
the message stays the one that acks it (RocketMQ's proxy maps the original handle to the broker's renewed one;
here the pop state is the proxy's own and the handle never changes).

What ends renewal:

* AckMessage, ChangeInvisibleDuration, ForwardMessageToDeadLetterQueue of the message (``discard``; an entry
  whose serial moved on is also dropped when it comes due);
* NotifyClientTermination or the client's presence timing out (``release_client``): each of its messages
  becomes visible ``RELEASE_INVISIBLE_MS`` later (RocketMQ: invisibleTimeMillisWhenClear);
* the client no longer alive when a message comes due (``alive`` says no: its Telemetry stream, which a live
  5.x client keeps open, closed and was not opened again): the message is left to become visible when its
  current invisible time ends (at most ``renew_ahead_ms`` later), so a client SIGKILLed mid-callback has its
  messages delivered to another consumer within one renewal step;
* ``renew_max_ms`` after the delivery: the last renewal runs out and the message is delivered again.

Cost: the records sit in a heap by ``renew_at_ms``; a renewal round pops only what is due, at most ``limit``
records per call (the caller yields between calls). An acked record stays in the heap until it comes due
(at most one renewal step) and is skipped then; per-client indexes make ``release_client`` cost that
client's records only, again at most ``limit`` per call.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from dataclasses import dataclass

from ferrymq.proxy.pop import PopEntry

#: a released message (its client ended or went silent) becomes visible this long after (RocketMQ's
#: invisibleTimeMillisWhenClear)
RELEASE_INVISIBLE_MS = 1_000
#: records renewed by one ``run_due`` call at most (the caller yields to the event loop between calls)
RENEW_ROUND_MAX = 2_048

PopKey = tuple[str, str, str, int]  # group, topic, broker name, queue id
#: (pop key, queue offset) -> the held entry, None when it is gone
EntryLookup = Callable[[PopKey, int], PopEntry | None]


@dataclass(slots=True)
class Held:
    client_id: str
    key: PopKey
    queue_offset: int
    serial: int
    received_ms: int
    renew_at_ms: int


@dataclass(slots=True)
class RenewRound:
    """What one ``run_due`` call did."""

    renewed: int = 0
    #: records dropped: acked or changed since, client gone, or past the maximum renew time
    ended: int = 0
    #: more records are due (the call stopped at its limit)
    more: bool = False


class RenewRegistry:
    """Messages held for renewal, by client, in a heap by renewal time."""

    def __init__(self, *, invisible_ms: int, ahead_ms: int, max_ms: int) -> None:
        if not 0 < ahead_ms < invisible_ms:
            raise ValueError("renew ahead time must be positive and below the auto-renew invisible time")
        self.invisible_ms = invisible_ms
        self.ahead_ms = ahead_ms
        self.max_ms = max_ms
        self._held: dict[tuple[PopKey, int], Held] = {}
        self._by_client: dict[str, set[tuple[PopKey, int]]] = {}
        self._heap: list[tuple[int, int, Held]] = []
        self._seq = itertools.count()

    def __len__(self) -> int:
        return len(self._held)

    def held_of(self, client_id: str) -> int:
        return len(self._by_client.get(client_id, ()))

    def add(self, client_id: str, key: PopKey, queue_offset: int, serial: int, *, now_ms: int,
            visible_at_ms: int) -> None:
        """A message delivered to ``client_id`` with auto-renewal, invisible until ``visible_at_ms``."""
        where = (key, queue_offset)
        self.discard(key, queue_offset)
        held = Held(client_id, key, queue_offset, serial, now_ms, visible_at_ms - self.ahead_ms)
        self._held[where] = held
        self._by_client.setdefault(client_id, set()).add(where)
        heapq.heappush(self._heap, (held.renew_at_ms, next(self._seq), held))

    def discard(self, key: PopKey, queue_offset: int) -> bool:
        """Stop renewing the message (acked, its invisible time changed, moved to the dead-letter queue)."""
        held = self._held.pop((key, queue_offset), None)
        if held is None:
            return False
        self._unindex(held)
        return True

    def _unindex(self, held: Held) -> None:
        mine = self._by_client.get(held.client_id)
        if mine is not None:
            mine.discard((held.key, held.queue_offset))
            if not mine:
                del self._by_client[held.client_id]

    def next_due_ms(self) -> int | None:
        """When the earliest record comes due (it may have been discarded since)."""
        return self._heap[0][0] if self._heap else None

    def run_due(self, now_ms: int, lookup: EntryLookup, alive: Callable[[str], bool],
                limit: int = RENEW_ROUND_MAX) -> RenewRound:
        """Renew the records due by ``now_ms`` (at most ``limit`` of them)."""
        out = RenewRound()
        heap = self._heap
        while heap and heap[0][0] <= now_ms:
            if out.renewed + out.ended >= limit:
                out.more = True
                break
            _, _, held = heapq.heappop(heap)
            where = (held.key, held.queue_offset)
            if self._held.get(where) is not held:
                continue  # discarded, or replaced by a later delivery's record
            entry = lookup(held.key, held.queue_offset)
            if (entry is None or entry.serial != held.serial or not alive(held.client_id)
                    or now_ms - held.received_ms >= self.max_ms):
                del self._held[where]
                self._unindex(held)
                out.ended += 1
                continue
            entry.visible_at_ms = max(entry.visible_at_ms, now_ms + self.invisible_ms)
            held.renew_at_ms = entry.visible_at_ms - self.ahead_ms
            heapq.heappush(heap, (held.renew_at_ms, next(self._seq), held))
            out.renewed += 1
        return out

    def release_client(self, client_id: str, now_ms: int, lookup: EntryLookup,
                       limit: int = RENEW_ROUND_MAX) -> tuple[int, bool]:
        """The client ended or went silent: stop renewing its messages and make each visible
        RELEASE_INVISIBLE_MS from now, at most ``limit`` of them per call; (how many were released, whether
        more of the client's remain: call again)."""
        mine = self._by_client.get(client_id)
        released = handled = 0
        while mine and handled < limit:
            held = self._held.pop(mine.pop(), None)
            handled += 1
            if held is None:
                continue
            entry = lookup(held.key, held.queue_offset)
            if entry is not None and entry.serial == held.serial:
                entry.visible_at_ms = min(entry.visible_at_ms, now_ms + RELEASE_INVISIBLE_MS)
                released += 1
        if not mine:
            self._by_client.pop(client_id, None)
            return released, False
        return released, True
