"""Ports on 127.0.0.1: finding free ones (port 0, then checked) and probing."""

from __future__ import annotations

import socket

LOOPBACK = "127.0.0.1"
#: Attempts at finding a free port (group) before giving up.
FREE_PORT_ATTEMPTS = 200

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


def free_port(*, broker: bool = False, host: str = LOOPBACK) -> int:
    """A free TCP port on ``host``. With ``broker=True`` also port-2 (fast channel) and port+1 (HA) are free.

    Ports handed out by this process are not handed out again (the OS may reuse an ephemeral port
    before the process we started binds it)."""
    for _ in range(FREE_PORT_ATTEMPTS):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((host, 0))
            port = int(s.getsockname()[1])
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
