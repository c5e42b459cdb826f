"""In-memory commit log and in-memory wire (clock: ``support.clock.ManualClock`` from ``T0_MS``) for the sans-IO HA protocol tests."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from ferrymq.ha.codec import TransferDecoder
from ferrymq.ha.master_conn import AckReceived, CloseConnection, MasterConnection, SendBytes
from ferrymq.ha.slave_conn import Appended, SlaveConnection
from support.clock import ManualClock


class FakeCommitLog:
    """Bytes at [base, base + len(data)); segments of ``segment_size`` bytes.

    ``read_from`` never crosses a segment; an empty log accepts ``append_at`` at any offset.
    """

    def __init__(self, segment_size: int, base: int = 0, data: bytes = b"") -> None:
        self.segment_size = segment_size
        self.base: int | None = base if (data or base) else None
        self.data = bytearray(data)
        self.appends: list[tuple[int, int]] = []

    def max_phy_offset(self) -> int:
        return 0 if self.base is None else self.base + len(self.data)

    def write(self, chunk: bytes) -> None:
        """Master-side local write."""
        if self.base is None:
            self.base = 0
        self.data += chunk

    def read_from(self, phy_offset: int, max_bytes: int) -> bytes:
        if self.base is None or phy_offset < self.base or phy_offset >= self.max_phy_offset():
            return b""
        seg_end = phy_offset - phy_offset % self.segment_size + self.segment_size
        end = min(phy_offset + max_bytes, seg_end, self.max_phy_offset())
        return bytes(self.data[phy_offset - self.base : end - self.base])

    def append_at(self, phy_offset: int, chunk: bytes) -> bool:
        if self.base is None:
            self.base = phy_offset
        elif phy_offset != self.max_phy_offset():
            return False
        self.data += chunk
        self.appends.append((phy_offset, len(chunk)))
        return True

    def bytes_between(self, start: int, end: int) -> bytes:
        assert self.base is not None
        return bytes(self.data[start - self.base : end - self.base])


#: start of the manual clock of the HA protocol tests
T0_MS = 1_000_000


Chunker = Callable[[bytes], list[bytes]]


def whole(data: bytes) -> list[bytes]:
    return [data] if data else []


def random_chunker(seed: int, max_piece: int = 17) -> Chunker:
    rng = random.Random(seed)

    def split(data: bytes) -> list[bytes]:
        out = []
        i = 0
        while i < len(data):
            n = rng.randint(1, max_piece)
            out.append(data[i : i + n])
            i += n
        return out

    return split


class Wire:
    """Joins a MasterConnection and a SlaveConnection with in-memory byte pipes."""

    def __init__(
        self, master: MasterConnection, slave: SlaveConnection, clock: ManualClock, chunker: Chunker = whole
    ) -> None:
        self.master = master
        self.slave = slave
        self.clock = clock
        self.chunker = chunker
        self.to_master: list[bytes] = []
        self.to_slave: list[bytes] = []
        self.master_closed: str | None = None
        self.slave_closed: str | None = None
        self.acks: list[AckReceived] = []
        self.appended: list[Appended] = []
        self.sent_to_slave = bytearray()  # every byte the master sent, for frame inspection
        self.sent_to_master = bytearray()

    def _from_master(self, outs: list[object]) -> None:
        self._take(outs, self.to_slave, self.sent_to_slave, AckReceived, self.acks, "master_closed")

    def _from_slave(self, outs: list[object]) -> None:
        self._take(outs, self.to_master, self.sent_to_master, Appended, self.appended, "slave_closed")

    def _take(self, outs: list[object], pipe: list[bytes], sent: bytearray, event_type: type,
              events: list[Any], closed_attr: str) -> None:
        """One side's outputs: bytes into the pipe to the other side, its events recorded, a close noted."""
        for o in outs:
            if isinstance(o, SendBytes):
                pipe.append(o.data)
                sent += o.data
            elif isinstance(o, event_type):
                events.append(o)
            elif isinstance(o, CloseConnection):
                setattr(self, closed_attr, o.reason)

    def connect(self) -> None:
        self._from_slave(self.slave.connection_made(self.clock()))

    def deliver(self) -> bool:
        """Move every queued byte across (chunked) once; True if anything moved."""
        moved = False
        pending, self.to_master = b"".join(self.to_master), []
        for piece in self.chunker(pending):
            self._from_master(self.master.receive_data(piece, self.clock()))
            moved = True
        pending, self.to_slave = b"".join(self.to_slave), []
        for piece in self.chunker(pending):
            self._from_slave(self.slave.receive_data(piece, self.clock()))
            moved = True
        return moved

    def pump(self, max_rounds: int = 100_000) -> None:
        """Deliver and let the master push until quiet (bounded)."""
        for _ in range(max_rounds):
            self._from_master(self.master.data_available(self.clock(), 4))
            if not self.deliver() and not self.to_slave and not self.to_master:
                self._from_master(self.master.data_available(self.clock(), 4))
                if not self.to_slave:
                    return
        raise AssertionError("wire did not settle")

    def tick(self) -> None:
        self._from_master(self.master.tick(self.clock()))
        self._from_slave(self.slave.tick(self.clock()))

    def frames_sent_to_slave(self) -> list[tuple[int, int]]:
        """(phy_offset, body_size) of every transfer the master produced."""
        dec = TransferDecoder()
        return [(t.phy_offset, len(t.body)) for t in dec.feed(bytes(self.sent_to_slave))]
