"""Permissions and remote-address patterns of ``plain_acl.yml``.

| perm text          | bits      | grants                  |
|--------------------|-----------|-------------------------|
| ``DENY``           | DENY      | nothing                 |
| ``PUB``            | PUB       | send                    |
| ``SUB``            | SUB       | pull, offsets, heartbeat|
| ``PUB|SUB``/``SUB|PUB`` | PUB+SUB | both              |

Address patterns (``globalWhiteRemoteAddresses``, ``whiteRemoteAddress``): ``*`` (any), an exact address
(IPv4 or IPv6), or an IPv4 address whose segments are each a number, ``*``, a range ``a-b`` or a set
``{a,b,c}`` (``192.168.0.*``, ``10.1.1-20.*``, ``192.168.1.{1,2}``).
"""

from __future__ import annotations

import enum
import ipaddress
from collections.abc import Callable


class Perm(enum.IntFlag):
    NONE = 0
    DENY = 1
    PUB = 4
    SUB = 8


PERM_TEXT: dict[str, Perm] = {
    "DENY": Perm.DENY, "PUB": Perm.PUB, "SUB": Perm.SUB,
    "PUB|SUB": Perm.PUB | Perm.SUB, "SUB|PUB": Perm.PUB | Perm.SUB,
}
IPV4_SEGMENTS = 4
IPV4_SEGMENT_MAX = 255


def parse_perm(text: object) -> Perm:
    """A perm text; ValueError naming the accepted forms."""
    if not isinstance(text, str) or text.strip().upper().replace(" ", "") not in PERM_TEXT:
        raise ValueError(f"expected one of DENY, PUB, SUB, PUB|SUB; got {text!r}")
    return PERM_TEXT[text.strip().upper().replace(" ", "")]


def grants(owned: Perm, needed: Perm) -> bool:
    """Whether ``owned`` covers ``needed`` (DENY covers nothing)."""
    if owned & Perm.DENY:
        return False
    return (owned & needed) == needed


AddressMatcher = Callable[[str], bool]


def _segment(text: str) -> Callable[[int], bool]:
    def num(s: str) -> int:
        if not s.isdigit() or int(s) > IPV4_SEGMENT_MAX:
            raise ValueError(f"bad address segment {s!r}")
        return int(s)

    if text == "*":
        return lambda _v: True
    if text.startswith("{") and text.endswith("}"):
        allowed = frozenset(num(s.strip()) for s in text[1:-1].split(","))
        return allowed.__contains__
    if "-" in text:
        lo_text, _, hi_text = text.partition("-")
        lo, hi = num(lo_text), num(hi_text)
        if lo > hi:
            raise ValueError(f"bad address range {text!r}")
        return lambda v: lo <= v <= hi
    value = num(text)
    return lambda v: v == value


def parse_address_pattern(text: object) -> AddressMatcher:
    """A matcher for one address pattern; ValueError when it is not one."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"expected an address pattern, got {text!r}")
    pattern = text.strip()
    if pattern == "*":
        return lambda _ip: True
    try:
        exact = ipaddress.ip_address(pattern)
    except ValueError:
        pass
    else:
        return lambda ip: _same_address(ip, exact)
    parts = pattern.split(".")
    if len(parts) != IPV4_SEGMENTS:
        raise ValueError(f"expected *, an address or a pattern like 192.168.0.*, got {pattern!r}")
    segments = [_segment(p) for p in parts]

    def match(ip: str) -> bool:
        values = ip.split(".")
        if len(values) != IPV4_SEGMENTS or not all(v.isdigit() for v in values):
            return False
        return all(seg(int(v)) for seg, v in zip(segments, values, strict=True))

    return match


def _same_address(ip: str, exact: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    try:
        return ipaddress.ip_address(ip) == exact
    except ValueError:
        return False
