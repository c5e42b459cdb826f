"""Network partitions between processes on 127.0.0.1, with iptables on the loopback interface.

Every process of a test runs on 127.0.0.1, so addresses cannot tell the sides apart, and a connection's
originating port is ephemeral. Instead each process that may be partitioned runs under its own group id
(``setpriv --regid GID``, see ``wrap_argv``), and:

* table ``mangle``, chain ``<tag>M`` (jumped to from OUTPUT on ``lo``): the first packet of every connection
  a process opens marks the connection (CONNMARK) with that process's gid (``-m owner --gid-owner``);
* table ``filter``, chain ``<tag>F`` (jumped to from OUTPUT on ``lo``), empty until ``cut``: for every
  process ``a`` of one side and every listening port ``p`` of the other, one rule drops the packets of the
  connections marked ``a`` whose original destination port is ``p`` (``-m connmark --mark a -m conntrack
  --ctorigdstport p``), in both directions, established connections included; and the same from the other
  side.

Connections of unmarked processes (the test's own clients, the name server, other tests on the machine) are
never touched. ``heal`` flushes the drop rules; ``remove`` deletes both chains and their jumps (also at
interpreter exit, so a failing test leaves no rule behind).
"""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass, field

#: group ids handed out to partitionable processes start here (per test process, so runs side by side differ)
GID_BASE = 47_000 + (os.getpid() % 1000) * 16
IPTABLES_TIMEOUT_S = 10


def _iptables(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    cp = subprocess.run(["iptables", "-w", *args], capture_output=True, text=True, timeout=IPTABLES_TIMEOUT_S)
    if check and cp.returncode != 0:
        raise RuntimeError(f"iptables {' '.join(args)}: {cp.stderr.strip() or cp.returncode}")
    return cp


def unavailable_reason() -> str | None:
    """Why partitions cannot run here, None when they can (iptables with the owner, connmark and conntrack
    matches, root, setpriv)."""
    if shutil.which("iptables") is None:
        return "iptables is not installed (apt-get install iptables)"
    if shutil.which("setpriv") is None:
        return "setpriv (util-linux) is not installed"
    if os.geteuid() != 0:
        return "iptables rules need root"
    chain = f"FP{os.getpid()}T"
    try:
        _iptables("-N", chain)
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
        return f"iptables is not permitted here: {exc}"
    try:
        _iptables("-A", chain, "-m", "connmark", "--mark", str(GID_BASE), "-m", "conntrack", "--ctorigdstport",
                  "1", "-j", "DROP")
        _iptables("-t", "mangle", "-N", chain)
        _iptables("-t", "mangle", "-A", chain, "-m", "conntrack", "--ctstate", "NEW", "-m", "owner",
                  "--gid-owner", str(GID_BASE), "-j", "CONNMARK", "--set-mark", str(GID_BASE))
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
        return f"iptables lacks the owner/connmark/conntrack matches: {exc}"
    finally:
        for table in ("filter", "mangle"):
            _iptables("-t", table, "-F", chain, check=False)
            _iptables("-t", table, "-X", chain, check=False)
    return None


@dataclass
class Node:
    """A partitionable process: its group id and the ports it listens on."""

    gid: int
    ports: list[int]


@dataclass
class LoopbackPartitions:
    tag: str = field(default_factory=lambda: f"FP{os.getpid()}")
    gids: list[int] = field(default_factory=list)
    installed: bool = False
    cut_now: bool = False

    @property
    def mark_chain(self) -> str:
        return f"{self.tag}M"

    @property
    def drop_chain(self) -> str:
        return f"{self.tag}F"

    def new_gid(self) -> int:
        gid = GID_BASE + len(self.gids) + 1
        self.gids.append(gid)
        if self.installed:
            self._mark(gid)
        return gid

    def wrap_argv(self, gid: int, argv: list[str]) -> list[str]:
        """``argv`` run under group id ``gid`` (uid unchanged)."""
        return ["setpriv", f"--regid={gid}", "--clear-groups", "--", *argv]

    def install(self) -> None:
        """The marking chain (before any marked process connects) and the empty drop chain."""
        self.remove()
        atexit.register(self.remove)
        _iptables("-t", "mangle", "-N", self.mark_chain)
        _iptables("-t", "mangle", "-I", "OUTPUT", "-o", "lo", "-j", self.mark_chain)
        _iptables("-N", self.drop_chain)
        _iptables("-I", "OUTPUT", "-o", "lo", "-j", self.drop_chain)
        self.installed = True
        for gid in self.gids:
            self._mark(gid)

    def _mark(self, gid: int) -> None:
        _iptables("-t", "mangle", "-A", self.mark_chain, "-m", "conntrack", "--ctstate", "NEW", "-m", "owner",
                  "--gid-owner", str(gid), "-j", "CONNMARK", "--set-mark", str(gid))

    def cut(self, side_a: Iterable[Node], side_b: Iterable[Node]) -> None:
        """Drop every connection between a process of ``side_a`` and one of ``side_b``."""
        a, b = list(side_a), list(side_b)
        self.heal()
        self.cut_now = True
        for mine, theirs in ((a, b), (b, a)):
            for node in mine:
                for other in theirs:
                    for port in other.ports:
                        _iptables("-A", self.drop_chain, "-m", "connmark", "--mark", str(node.gid), "-m", "conntrack",
                                  "--ctorigdstport", str(port), "-j", "DROP")

    def heal(self) -> None:
        if self.installed:
            _iptables("-F", self.drop_chain)
        self.cut_now = False

    def remove(self) -> None:
        """Delete both chains and the jumps to them (idempotent; errors ignored)."""
        for table, chain in (("filter", self.drop_chain), ("mangle", self.mark_chain)):
            while _iptables("-t", table, "-D", "OUTPUT", "-o", "lo", "-j", chain, check=False).returncode == 0:
                pass
            _iptables("-t", table, "-F", chain, check=False)
            _iptables("-t", table, "-X", chain, check=False)
        self.installed = False
        self.cut_now = False
