"""Byte-size parsing/formatting for bench options (``2GiB``, ``512MiB``, ``128B``, ``1KiB``)."""

from __future__ import annotations

import re

_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "kib": 1024,
    "m": 1000**2, "mb": 1000**2, "mib": 1024**2,
    "g": 1000**3, "gb": 1000**3, "gib": 1024**3,
}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str | int) -> int:
    """``"2GiB"`` -> 2147483648; plain integers are bytes."""
    if isinstance(text, int):
        return text
    m = _SIZE_RE.match(text)
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(f"not a byte size: {text!r} (examples: 128B, 1KiB, 512MiB, 2GiB)")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def parse_sizes(text: str) -> list[int]:
    return [parse_size(p) for p in text.split(",") if p.strip()]


def fmt_size(n_bytes: int) -> str:
    for unit, factor in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n_bytes >= factor and n_bytes % factor == 0:
            return f"{n_bytes // factor}{unit}"
    if n_bytes >= 1024**2:
        return f"{n_bytes / 1024**2:.1f}MiB"
    return f"{n_bytes}B"
