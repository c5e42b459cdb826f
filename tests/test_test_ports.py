"""The tests' port allocator (tests/support/ports.py): ports that a restarted server can bind again."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from support.ports import free_port, port_free

#: the kernel's range of local ports for outgoing connections, read here independently of the allocator
EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def test_ports_are_drawn_below_the_ephemeral_range() -> None:
    """A server restarted on its old port failed to bind it ("address already in use") when an outgoing
    connection had been given that port while the server was down: ports came from bind(port 0), which is
    the ephemeral range the kernel also hands to outgoing connections."""
    try:
        first_ephemeral = int(EPHEMERAL_RANGE_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        pytest.skip("no Linux ephemeral port range to check against")
    if first_ephemeral < 22_002:
        pytest.skip(f"the ephemeral range starts at {first_ephemeral}: no room below it (port 0 is the fallback)")
    for _ in range(50):
        assert free_port() < first_ephemeral
        port = free_port(broker=True)
        assert 1024 < port - 2 and port + 1 < first_ephemeral


def test_handed_out_ports_are_free_and_distinct() -> None:
    seen: set[int] = set()
    for _ in range(50):
        port = free_port(broker=True)
        group = {port - 2, port, port + 1}
        assert not group & seen
        seen |= group
        assert all(port_free(p) for p in group)


def test_a_port_in_use_is_not_handed_out() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", free_port()))
        listener.listen()
        taken = listener.getsockname()[1]
        assert not port_free(taken)
        assert all(free_port() != taken for _ in range(200))
