"""Ports on 127.0.0.1: finding free ones and probing.

Servers that tests restart on their old port (a broker after its SIGKILL) must not get a port of the kernel's
ephemeral range: while the server is down, any outgoing connection on the machine may be given that port as
its local port, and the restarted server then fails to bind it ("address already in use"). So ports are
drawn at random from below the ephemeral range (``/proc/sys/net/ipv4/ip_local_port_range``) and checked
free; port 0 (an ephemeral port) is the fallback where that range is too small.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

LOOPBACK = "127.0.0.1"
#: Attempts at finding a free port (group) before giving up.
FREE_PORT_ATTEMPTS = 200
#: Lowest port handed out: above the registered ports of common local services (databases, brokers).
LOWEST_PORT = 20_000
#: Fewest ports below the ephemeral range worth drawing from; with fewer, ephemeral ports are used.
MIN_STATIC_RANGE = 2_000
EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
#: Linux's default ephemeral range, used where the file cannot be read.
DEFAULT_EPHEMERAL_RANGE = (32_768, 60_999)

_rng = random.Random()

_handed_out: set[int] = set()


def port_free(port: int, host: str = LOOPBACK) -> bool:
    if not 0 < port < 65536:
        return False
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def ephemeral_range() -> tuple[int, int]:
    """The kernel's range of local ports for outgoing connections (first, last)."""
    try:
        first, last = (int(v) for v in EPHEMERAL_RANGE_FILE.read_text().split())
    except (OSError, ValueError):
        return DEFAULT_EPHEMERAL_RANGE
    return first, last


def _candidate_port(host: str) -> int:
    first_ephemeral = ephemeral_range()[0]
    if first_ephemeral - 2 - LOWEST_PORT >= MIN_STATIC_RANGE:
        return _rng.randrange(LOWEST_PORT + 2, first_ephemeral - 1)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def free_port(*, broker: bool = False, host: str = LOOPBACK) -> int:
    """A free TCP port on ``host``, below the ephemeral range (module docstring). With ``broker=True`` also
    port-2 (fast channel) and port+1 (HA) are free.

    Ports handed out by this process are not handed out again (the process we started may not have bound
    it yet)."""
    for _ in range(FREE_PORT_ATTEMPTS):
        port = _candidate_port(host)
        group = [port - 2, port, port + 1] if broker else [port]
        if any(p in _handed_out for p in group):
            continue
        if all(port_free(p, host) for p in group):
            _handed_out.update(group)
            return port
    raise RuntimeError(f"no free port found on {host}")


def port_answers(port: int, host: str = LOOPBACK, timeout_s: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False
