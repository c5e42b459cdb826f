"""RocketMQ 5 "pop" consumption kept by the proxy on top of 4.x pull and consumer offsets; sans-IO.

ferrymq's broker has no POP request, so the proxy keeps, per (group, topic, broker, queue), the messages it
pulled and has not seen acknowledged (``PopQueue.entries``, in queue-offset order):

| entry field    | meaning                                                                         |
|----------------|---------------------------------------------------------------------------------|
| message        | the pulled ``MessageExt``                                                       |
| attempt        | deliveries so far (0: pulled, never delivered; the first delivery is attempt 1) |
| visible_at_ms  | when the entry may be delivered (again); 0 for a never delivered one            |
| serial         | the delivery the current receipt handle names (an older handle is refused)      |

* A delivery makes the entry invisible for the requested duration and bumps its serial.
* An ack removes the entry; ChangeInvisibleDuration moves ``visible_at_ms`` (and bumps the serial).
* An entry whose ``visible_at_ms`` passed is delivered again with attempt + 1; once ``attempt`` reached
  the maximum it is handed back as dead (the caller moves it to ``%DLQ%<group>``) instead.
* Committed offset = the first entry's queue offset, or the next pull offset when nothing is held: every
  message below it was acknowledged (or filtered out by the broker), so the broker's consumer offset can
  move there. After a pull from its broker failed it is written again even when unchanged (``recommit``): a
  broker that was SIGKILLed lost the offsets it had not written to disk yet, a replica that took over may
  hold an older copy. A proxy that restarts re-reads from that offset: messages acked above a still-unacked one
  are delivered again (at least once; attempts start again at 1).
* FIFO groups: a queue delivers nothing while one of its entries is invisible (delivered, not yet acked),
  so messages of one queue, hence of one message group, are processed one batch at a time, in order.
* A queue that ends before ``pull_offset`` (a pull answers "offset illegal" with a smaller end: a replica
  took over from a master whose last messages it never got, and may store other messages at their
  offsets) is ``rewind``-ed: every held entry is forgotten and pulling starts again at the committed offset
  (or the queue's end, if that is lower). The new history's messages are delivered; unacknowledged ones of
  the lost history are not; acknowledged ones above the committed offset come again (at least once).

Entries are kept in insertion (= queue offset) order in a dict, so the first key is the committed offset.
At most ``MAX_HELD_PER_QUEUE`` entries are held per queue (a receive pulls nothing more beyond it).
"""

from __future__ import annotations

from dataclasses import dataclass

from ferrymq.common.message import MessageExt

#: pulled-but-unacknowledged messages held per queue at most (memory bound of the pop state)
MAX_HELD_PER_QUEUE = 1024
#: ``committed_offset`` when the broker's copy is not known to hold it (written again at the next round)
COMMITTED_UNKNOWN = -1


@dataclass(slots=True)
class PopEntry:
    message: MessageExt
    attempt: int = 0
    visible_at_ms: int = 0
    serial: int = 0


@dataclass(frozen=True, slots=True)
class Delivery:
    entry: PopEntry
    serial: int
    attempt: int


class PopQueue:
    """Pop state of one queue for one consumer group."""

    __slots__ = ("pull_offset", "entries", "committed_offset", "fifo", "fresh", "failures_seen")

    def __init__(self, start_offset: int, *, fifo: bool = False) -> None:
        #: next queue offset to pull from the broker
        self.pull_offset = start_offset
        #: queue offset -> entry, ascending
        self.entries: dict[int, PopEntry] = {}
        #: the offset last written to the broker (see ``commit_offset``)
        self.committed_offset = start_offset
        self.fifo = fifo
        #: entries pulled and never delivered (always ready): the prefetch watermark reads it
        self.fresh = 0
        #: failed pulls of the queue's broker counted when the offset was last marked to be written again
        #: (the caller's count; see ``recommit``)
        self.failures_seen = 0

    # ---- pulling -----------------------------------------------------------------------------------
    def room(self) -> int:
        return MAX_HELD_PER_QUEUE - len(self.entries)

    def add_pulled(self, messages: list[MessageExt], next_pull_offset: int) -> None:
        """Messages a pull from ``pull_offset`` returned (filtered ones absent) and the next offset."""
        for msg in messages:
            if msg.queue_offset >= self.pull_offset and msg.queue_offset not in self.entries:
                self.entries[msg.queue_offset] = PopEntry(msg)
                self.fresh += 1
        self.pull_offset = max(self.pull_offset, next_pull_offset)

    def reset_pull_offset(self, next_pull_offset: int) -> None:
        """The broker moved the offset (out of range): nothing held below it can be delivered any more."""
        self.pull_offset = next_pull_offset
        for offset in [o for o in self.entries if o < next_pull_offset]:
            self._drop(offset)

    def rewind(self, queue_end: int) -> None:
        """The queue ends at ``queue_end``, before ``pull_offset``: the broker serving it now (a replica that
        took over from a dead master) lacks the last messages pulled, and may store others at their offsets.
        Held entries may belong to the lost history: forget them all and pull again from the first message
        not acknowledged (at most the queue's end). Messages acknowledged above it are delivered again."""
        self.pull_offset = min(self.commit_offset(), queue_end)
        self.entries.clear()
        self.fresh = 0

    # ---- delivering ---------------------------------------------------------------------------------
    def blocked(self, now_ms: int) -> bool:
        """FIFO: an entry is out (delivered, invisible, not acked): nothing more from this queue."""
        if not self.fifo:
            return False
        return any(e.attempt > 0 and e.visible_at_ms > now_ms for e in self.entries.values())

    def has_ready(self, now_ms: int) -> bool:
        return any(e.visible_at_ms <= now_ms for e in self.entries.values())

    def next_visible_ms(self) -> int | None:
        """The earliest time an invisible entry becomes deliverable again."""
        times = [e.visible_at_ms for e in self.entries.values() if e.attempt > 0]
        return min(times) if times else None

    def take(self, now_ms: int, max_count: int, invisible_ms: int, max_attempts: int,
             next_serial: _SerialSource) -> tuple[list[Delivery], list[PopEntry]]:
        """Deliver up to ``max_count`` ready entries in offset order; entries out of attempts come back
        as dead (still held: the caller ``remove``s them once they reached the dead-letter queue)."""
        out: list[Delivery] = []
        dead: list[PopEntry] = []
        if max_count <= 0 or self.blocked(now_ms):
            return out, dead
        for entry in self.entries.values():
            if entry.visible_at_ms > now_ms:
                if self.fifo:
                    break  # in order: nothing after an entry that is not ready
                continue
            if entry.attempt >= max_attempts:
                dead.append(entry)
                entry.visible_at_ms = now_ms + invisible_ms  # not offered again while it is being moved
                continue
            if entry.attempt == 0:
                self.fresh -= 1
            entry.attempt += 1
            entry.visible_at_ms = now_ms + invisible_ms
            entry.serial = next_serial()
            out.append(Delivery(entry, entry.serial, entry.attempt))
            if len(out) >= max_count:
                break
        return out, dead

    # ---- acknowledging -----------------------------------------------------------------------------
    def ack(self, queue_offset: int, serial: int) -> bool:
        """Remove the entry the handle names; False when it is not the current delivery (already acked,
        or delivered again since)."""
        entry = self.entries.get(queue_offset)
        if entry is None or entry.serial != serial:
            return False
        self._drop(queue_offset)
        return True

    def change_invisible(self, queue_offset: int, serial: int, visible_at_ms: int,
                         next_serial: _SerialSource) -> int | None:
        """New serial of the entry, now invisible until ``visible_at_ms``; None for a stale handle."""
        entry = self.entries.get(queue_offset)
        if entry is None or entry.serial != serial:
            return None
        entry.visible_at_ms = visible_at_ms
        entry.serial = next_serial()
        return entry.serial

    def remove(self, queue_offset: int) -> None:
        self._drop(queue_offset)

    def _drop(self, queue_offset: int) -> None:
        entry = self.entries.pop(queue_offset, None)
        if entry is not None and entry.attempt == 0:
            self.fresh -= 1

    # ---- offsets -------------------------------------------------------------------------------------
    def recommit(self) -> None:
        """The broker may have lost the offset written last (a pull failed: it may be restarting, having
        written its offsets to disk only now and then, or another broker is taking over): write it again."""
        self.committed_offset = COMMITTED_UNKNOWN

    def commit_offset(self) -> int:
        """Every message below this offset is acknowledged (or was filtered out)."""
        for first in self.entries:
            return first
        return self.pull_offset


class _SerialSource:
    """Callable handing out delivery serials (one counter per proxy process)."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0

    def __call__(self) -> int:
        self.value += 1
        return self.value


SerialSource = _SerialSource
