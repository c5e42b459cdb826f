"""Heap settings of the processes that run the Spark connector (glibc only): keep freed blocks for reuse.

Every Arrow batch the source builds and every PULL body it receives is a fresh allocation of megabytes. With
glibc's defaults such blocks are mmap'd and handed back to the kernel when freed, so the next batch pays a page
fault and the kernel's zeroing for every page it writes: on a read of 1 KiB messages that was more than half of
the C column pass's time (``benchmarks/spark_read.py``, docs/spark.md Performance). Raised thresholds keep those
blocks on the heap, where the next batch reuses them.

| ``mallopt`` parameter | value   | effect                                                                    |
|-----------------------|---------|---------------------------------------------------------------------------|
| M_MMAP_THRESHOLD (-3) | 32 MiB  | blocks below it come from the heap instead of their own mmap              |
| M_TRIM_THRESHOLD (-1) | 128 MiB | up to this much free memory at the top of a heap is kept, not handed back |

``tune()`` applies them once per process; ``runtime.loop()`` calls it, so the Python processes Spark starts for
the connector get them: the workers that plan, read and write, and the streaming source runner (the user's own
driver process does not run the connector's client unless it calls it directly). A worker may then keep up to
the trim threshold of freed memory for its next batches instead of handing it back at once.
``FERRYMQ_SPARK_MALLOC_TUNING=0`` in the environment leaves the allocator as it is. On a C library other than
glibc nothing happens.
"""

from __future__ import annotations

import ctypes
import os

#: Environment variable that turns the tuning off when set to 0.
TUNING_ENV = "FERRYMQ_SPARK_MALLOC_TUNING"
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 32 * 1024 * 1024
TRIM_THRESHOLD_BYTES = 128 * 1024 * 1024

_tuned_pid: int | None = None


def _is_glibc() -> bool:
    try:
        return os.confstr("CS_GNU_LIBC_VERSION") is not None
    except (ValueError, OSError, AttributeError):
        return False


def tune() -> bool:
    """Apply the thresholds to this process (once per pid); True when they are in effect."""
    global _tuned_pid
    if _tuned_pid == os.getpid():
        return True
    if os.environ.get(TUNING_ENV, "1").strip() == "0" or not _is_glibc():
        return False
    libc = ctypes.CDLL(None)
    applied = libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1
    applied = libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES) == 1 and applied
    if applied:
        _tuned_pid = os.getpid()
    return applied
