"""Loader of the optional C extension ``ferrymq.store._speedups`` (the only module that imports it).

``NATIVE`` is the extension module, or None when it was not built (no compiler at install time) or when
``FERRYMQ_PURE_PYTHON=1`` is set in the environment; the store reads it when it builds its objects, and
falls back to the pure-Python code (the reference) when it is None. ``EXTENSION`` is the module whatever
the environment says (for tests that compare the two paths).

C functions (see the field table at the top of ``_speedups.c``):

* ``scan_dispatch(buf, pos, end, max_records, file_from_offset, want_index)`` ->
  ``(records, end_pos, last_store_timestamp, stop, runs, index_entries)``: ``Dispatcher.reput``'s walk
  and ``dispatch_run``'s work for plain records; ``runs`` = ``[(topic, queue_id, first_queue_offset,
  units)]`` with ``units`` packed 20-byte consume queue units; ``index_entries`` = packed
  ``SCAN_INDEX_ENTRY`` records.
* ``index_put_many(mm, entries, start, slot_num, index_num, index_count, hash_slot_count,
  begin_timestamp, begin_phy_offset)`` -> ``(next, index_count, hash_slot_count, begin_timestamp,
  begin_phy_offset, end_phy_offset, end_timestamp)``: ``IndexFile.put_hashed_many`` for packed entries.
* ``put_batch(mm, pos, room, batch_body, topic, queue_id, queue_offset, phy_offset, merge_props, cluster,
  born_host, store_host, born_timestamp, clock_ms, sys_flag, reconsume_times, max_props, max_body)`` ->
  None (the Python path decides) or ``(count, total, offsets, msg_ids, store_timestamp)``: the SEND_BATCH
  records written into the segment (``CommitLog.put_batch_raw``; offsets None = does not fit in ``room``).
* ``put_one(mm, pos, room, body, props, topic, queue_id, queue_offset, phy_offset, cluster, born_host, store_host,
  born_timestamp, clock_ms, flag, sys_flag, reconsume_times, max_props, max_body)`` -> None (the Python path
  decides) or ``(total, wait, msg_id, store_timestamp)``: a plain SEND_MESSAGE's record (header properties
  parsed, WAIT taken out, CLUSTER set) written into the segment (``CommitLog.put_one_raw``; msg_id None = does
  not fit in ``room``).
* ``pull_scan(units, i, mm, file_from, wrote_pos, data_start, first_queue_offset, max_msg_nums, count_mem,
  bytes_mem, count_disk, bytes_disk, max_phy, memory, total_bytes, buffers, queue_offsets)`` -> ``(i,
  total_bytes, last_phy)``: ``StoreReader._scan``'s loop for a pull without a filter over the units whose
  records lie in one segment and pass the fast check; it stops at any other unit, which the Python loop takes.
* ``crc32(data, value=0, /)`` -> int: ``zlib.crc32`` (same results, same argument checks), folded with
  carry-less multiplication (PCLMULQDQ + SSE4.1, chosen at import from the CPU; zlib otherwise); put_batch
  and put_one compute BODYCRC with it. ``_crc32_constants()`` and ``_crc32_force_fallback(force)`` are for
  tests. ``crc32`` below is it when the extension is in use, else ``zlib.crc32``.
"""

from __future__ import annotations

import importlib
import os
import struct
import zlib
from collections.abc import Callable
from types import ModuleType

PURE_PYTHON_ENV = "FERRYMQ_PURE_PYTHON"

#: a packed scan index entry (native byte order): phy_offset, store_timestamp, key_hash, padding
SCAN_INDEX_ENTRY = struct.Struct("=qqI4x")

#: why scan_dispatch stopped
SCAN_STOP_LIMIT = 0  # max_records dispatched
SCAN_STOP_END = 1  # reached ``end``
SCAN_STOP_RECORD = 2  # the record at end_pos is for the Python path
SCAN_STOP_GROUPS = 3  # too many queues in one window: call again


def _load_extension() -> ModuleType | None:
    try:
        module = importlib.import_module("ferrymq.store._speedups")
    except ImportError:
        return None
    if module.SCAN_INDEX_ENTRY_SIZE != SCAN_INDEX_ENTRY.size:  # a stale build: don't trust it
        return None
    return module


def pure_python_forced() -> bool:
    return os.environ.get(PURE_PYTHON_ENV, "") not in ("", "0")


EXTENSION: ModuleType | None = _load_extension()
NATIVE: ModuleType | None = None if pure_python_forced() else EXTENSION

#: ``zlib.crc32(data, value=0)``: the extension's (faster from 64 bytes up) when NATIVE is loaded (and has it:
#: an older build does not)
crc32: Callable[..., int] = getattr(NATIVE, "crc32", zlib.crc32)

__all__ = [
    "EXTENSION",
    "NATIVE",
    "PURE_PYTHON_ENV",
    "SCAN_INDEX_ENTRY",
    "SCAN_STOP_END",
    "SCAN_STOP_GROUPS",
    "SCAN_STOP_LIMIT",
    "SCAN_STOP_RECORD",
    "crc32",
    "pure_python_forced",
]
