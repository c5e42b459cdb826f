"""What one peer may cost a server: connections, buffered bytes, and the time a frame may take to arrive.

A server (broker, fast port, name server) holds one ``ServerLimits`` and one ``ServerBudget`` shared by its
connections. Every limit is enforced where the cost arises, in O(1):

| limit                       | default  | what happens past it                                               |
|-----------------------------|----------|--------------------------------------------------------------------|
| max_connections             | 10000    | a new connection is closed at once (one throttled WARNING)         |
| max_connections_per_address | 2000     | likewise, for one remote IP                                        |
| frame_deadline_ms           | 15000    | a frame begun but not complete after this: the connection closes   |
| max_partial_bytes_total     | 128 MiB  | unfinished frames of all connections: the one growing past it closes |
| write_high_water_bytes      | 4 MiB    | answers not yet taken by the peer: reading from it pauses until the |
|                             |          | peer reads again (a client that never reads gets no more served)   |
| max_write_buffer_bytes      | 64 MiB   | answers buffered for one peer (in-flight requests still answer      |
|                             |          | while reading is paused): the connection closes                    |
| max_write_buffer_bytes_total| 512 MiB  | answers buffered for all paused peers: the largest closes          |

A single frame is bounded separately by ``codec.MAX_FRAME_BYTES``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ferrymq.remoting.codec import MAX_FRAME_BYTES

DEFAULT_MAX_CONNECTIONS = 10_000
DEFAULT_MAX_CONNECTIONS_PER_ADDRESS = 2_000
DEFAULT_FRAME_DEADLINE_MS = 15_000
DEFAULT_MAX_PARTIAL_BYTES_TOTAL = 128 * 1024 * 1024
DEFAULT_WRITE_HIGH_WATER_BYTES = 4 * 1024 * 1024
DEFAULT_MAX_WRITE_BUFFER_BYTES = 64 * 1024 * 1024
DEFAULT_MAX_WRITE_BUFFER_BYTES_TOTAL = 512 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class ServerLimits:
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    max_connections_per_address: int = DEFAULT_MAX_CONNECTIONS_PER_ADDRESS
    frame_deadline_ms: int = DEFAULT_FRAME_DEADLINE_MS
    max_partial_bytes_total: int = DEFAULT_MAX_PARTIAL_BYTES_TOTAL
    write_high_water_bytes: int = DEFAULT_WRITE_HIGH_WATER_BYTES
    max_write_buffer_bytes: int = DEFAULT_MAX_WRITE_BUFFER_BYTES
    max_write_buffer_bytes_total: int = DEFAULT_MAX_WRITE_BUFFER_BYTES_TOTAL

    def __post_init__(self) -> None:
        for name in ("max_connections", "max_connections_per_address", "frame_deadline_ms",
                     "max_partial_bytes_total", "write_high_water_bytes", "max_write_buffer_bytes",
                     "max_write_buffer_bytes_total"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")
        if self.max_partial_bytes_total < MAX_FRAME_BYTES:
            raise ValueError(f"max_partial_bytes_total must hold one whole frame ({MAX_FRAME_BYTES} bytes)")
        if self.max_write_buffer_bytes <= self.write_high_water_bytes:
            raise ValueError("max_write_buffer_bytes must be above write_high_water_bytes")


@dataclass(slots=True)
class ServerBudget:
    """The shared running totals of one server's connections."""

    limits: ServerLimits = field(default_factory=ServerLimits)
    #: bytes of unfinished frames held by all connections
    partial_bytes: int = 0
    #: open connections per remote IP
    per_address: dict[str, int] = field(default_factory=dict)
    connections: int = 0
