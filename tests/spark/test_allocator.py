"""The connector's heap settings: after ``allocator.tune()`` a multi-megabyte block comes from the heap (reused
after a free) instead of its own mmap; ``FERRYMQ_SPARK_MALLOC_TUNING=0`` leaves the allocator alone. Each case
runs in a fresh interpreter, whose allocator nothing has tuned yet."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.spark

PROBE = """
import ctypes, sys
from ferrymq.spark import allocator

class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]

libc = ctypes.CDLL(None)
libc.mallinfo2.restype = MallInfo2
tuned = allocator.tune()
assert allocator.tune() == tuned  # once per process, same answer
before = libc.mallinfo2().hblkhd
block = bytearray(8 * 1024 * 1024)
print(int(tuned), libc.mallinfo2().hblkhd - before)
"""


def _probe(env: dict[str, str]) -> tuple[bool, int]:
    out = subprocess.run([sys.executable, "-c", PROBE], env={**os.environ, **env}, capture_output=True, text=True,
                         timeout=60, check=True).stdout.split()  # fmt: skip
    return out[0] == "1", int(out[1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_tuned_process_takes_big_blocks_from_the_heap() -> None:
    tuned, mmapped = _probe({})
    assert tuned and mmapped == 0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_tuning_can_be_turned_off() -> None:
    tuned, mmapped = _probe({"FERRYMQ_SPARK_MALLOC_TUNING": "0"})
    assert not tuned and mmapped >= 8 * 1024 * 1024
