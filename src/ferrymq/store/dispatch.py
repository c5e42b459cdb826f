"""Reput: turn newly appended, complete commit log records into consume queue units and index
entries. Everything is derived from the record itself (QUEUEOFFSET, TAGS, DELAY, KEYS,
UNIQ_KEY, SYSFLAG), so a slave dispatching replicated bytes builds the same files as its master.

With the C extension (``speedups.NATIVE``), ``reput`` walks the commit log bytes natively on master and
slave alike (``_speedups.scan_dispatch``: consume queue units packed per queue run, index keys hashed) and
hands every record the scan does not handle (transactions, SCHEDULE_TOPIC_XXXX, IPv6 hosts, non-ASCII
text, BLANK/END/INCOMPLETE/CORRUPT) to the Python code below, one at a time, so the rules live in one
place. Without it, on the master ``CommitLog.pending`` already holds each record's ``RecordMeta``; the
parser is the fallback (slave, start-up re-dispatch, or an overflowed pending queue).

``reput_end`` bounds the dispatch (controller mode without ``readUnCommitted``: the commit log's confirm
offset, the end of what every SyncStateSet member holds): only records that end at or below it are dispatched,
so consume queues, the index and everything derived from them (pulls, max offsets, lag, long polling) never
show a record a failover may take back. The rest is dispatched by a later reput, once the bound has passed it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from types import ModuleType

from ferrymq.common.message import (
    KEY_SEPARATOR,
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_KEYS,
    PROPERTY_TAGS,
    PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX,
    SYSFLAG_TRANSACTION_MASK,
    SYSFLAG_TRANSACTION_PREPARED,
    SYSFLAG_TRANSACTION_ROLLBACK,
)
from ferrymq.common.message_codec import RecordCheck, RecordMeta, check_record_meta
from ferrymq.store import speedups
from ferrymq.store.commit_log import CommitLog
from ferrymq.store.config import CQ_STORE_UNIT_SIZE, StoreConfig
from ferrymq.store.errors import StoreError
from ferrymq.store.index import IndexService, java_hash_fast
from ferrymq.store.mapped_file import MappedFile
from ferrymq.store.queue_table import ConsumeQueueTable, topic_dir_name_ok

log = logging.getLogger(__name__)

SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
_NO_CQ = (SYSFLAG_TRANSACTION_PREPARED, SYSFLAG_TRANSACTION_ROLLBACK)
_UNLIMITED = 1 << 62


def get_property(properties: str, name: str) -> str | None:
    """Value of ``name`` in a properties string without building a dict (last one wins)."""
    return _prop(properties, name + "\x01") if properties else None


def _prop(properties: str, needle: str) -> str | None:
    """``get_property`` with a precomputed ``name + "\\x01"`` needle (non-empty properties)."""
    i = properties.rfind(needle)
    while i != -1:
        if i == 0 or properties[i - 1] == "\x02":
            start = i + len(needle)
            end = properties.find("\x02", start)
            return properties[start:] if end == -1 else properties[start:end]
        i = properties.rfind(needle, 0, i)
    return None


_TAGS_NEEDLE = PROPERTY_TAGS + "\x01"
_UNIQ_NEEDLE = PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX + "\x01"
_KEYS_NEEDLE = PROPERTY_KEYS + "\x01"
#: most units grouped into one ConsumeQueue.put_units call by dispatch_run
DISPATCH_RUN_UNITS_MAX = 256
#: parsed records (slave / fallback) handed to one dispatch_run
DISPATCH_RUN_RECORDS_MAX = 1024
#: most records one native scan_dispatch call walks (one window of units and index entries)
NATIVE_SCAN_RECORDS_MAX = 4096
#: a dispatch that stays paused for the same reason is logged again after this long
STALL_LOG_INTERVAL_S = 10.0
#: the smallest native scan window a slow dispatch shrinks to (records whose units each touch a new page of their
#: queue's file: every one a page fault, which waits for the page's writeback while the flush thread syncs it)
NATIVE_SCAN_RECORDS_MIN = 64


def index_keys_of(properties: str) -> list[str]:
    keys: list[str] = []
    uniq = get_property(properties, PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX)
    if uniq:
        keys.append(uniq)
    raw = get_property(properties, PROPERTY_KEYS)
    if raw:
        keys.extend(k for k in raw.split(KEY_SEPARATOR) if k)
    return keys


class Dispatcher:
    def __init__(
        self,
        config: StoreConfig,
        commit_log: CommitLog,
        queues: ConsumeQueueTable,
        index: IndexService | None,
    ) -> None:
        self.commit_log = commit_log
        self.queues = queues
        self.index = index
        self.delay_table_ms = config.delay_level_table_ms()
        self.max_delay_level = max(self.delay_table_ms, default=0)
        self.reput_phy_offset = 0
        self.last_dispatch_timestamp = 0  # store time of the newest dispatched record
        self.dispatched_total = 0
        self._corrupt_logged_at = -1
        self._tags_codes: dict[str, int] = {}
        self._topic_ok: dict[str, bool] = {}
        #: why the last reput stopped short of the log's end (a file could not be opened or reserved), or ""
        self.stalled_reason = ""
        self._stall_logged_at_s = 0.0
        #: the C extension, or None for the pure-Python path (read once: tests switch it per store)
        self.native = speedups.NATIVE
        #: the phy offset records must end at or below to be dispatched (None: the commit log's end)
        self.reput_end: Callable[[], int] | None = None
        #: the last reput stopped at its time budget with records left to dispatch (the caller goes on soon)
        self.cut_short = False
        #: records per native scan window under a time budget: halved after a window that took more than a
        #: quarter of the budget, doubled after one under a sixteenth (NATIVE_SCAN_RECORDS_MIN .. _MAX)
        self._scan_window = NATIVE_SCAN_RECORDS_MAX

    def reput_end_phy_offset(self) -> int:
        """Where this reput may dispatch up to: the log's end, or ``reput_end`` when that is lower."""
        max_phy = self.commit_log.max_offset
        bound = self.reput_end
        return max_phy if bound is None else min(max_phy, bound())

    def behind_bytes(self) -> int:
        """Bytes the dispatch could have reached and has not; 0 while the next record ends beyond
        ``reput_end`` (it waits for the bound: it is not behind)."""
        cl = self.commit_log
        end = self.reput_end_phy_offset()
        r = self.reput_phy_offset
        if r >= end:
            return 0
        if self.reput_end is not None and end < cl.max_offset:
            mf = cl.mfq.find(r)
            if mf is not None:
                pos = r - mf.file_from_offset
                if pos + 4 <= mf.wrote_position:
                    size = int.from_bytes(mf.mm[pos:pos + 4], "big", signed=True)
                    if size > 0 and r + size > end:
                        return 0
        return end - r

    def tags_code(self, topic: str, properties: str, store_timestamp: int) -> int:
        if topic == SCHEDULE_TOPIC:
            raw = get_property(properties, PROPERTY_DELAY_TIME_LEVEL)
            try:
                level = int(raw) if raw else 0
            except ValueError:
                level = 0
            level = min(level, self.max_delay_level)
            return store_timestamp + self.delay_table_ms.get(level, 0)
        tags = get_property(properties, PROPERTY_TAGS)
        if not tags:
            return 0
        code = self._tags_codes.get(tags)
        if code is None:
            code = java_hash_fast(tags)
            if len(self._tags_codes) < 10_000:
                self._tags_codes[tags] = code
        return code

    def dispatch(self, meta: RecordMeta, phy_offset: int) -> None:
        _phy, size, topic, queue_id, queue_offset, store_ts, sys_flag, properties = meta
        tran = sys_flag & SYSFLAG_TRANSACTION_MASK
        if tran not in _NO_CQ and topic_dir_name_ok(topic):
            key = (topic, queue_id)
            queues = self.queues
            cq = queues.queues.get(key) or queues.get_or_create(topic, queue_id)
            if topic == SCHEDULE_TOPIC or not properties:
                tags = self.tags_code(topic, properties, store_ts)
            else:  # tags_code() inlined for the common case
                tags_text = _prop(properties, _TAGS_NEEDLE)
                if not tags_text:
                    tags = 0
                else:
                    tags = self._tags_codes.get(tags_text)  # type: ignore[assignment]
                    if tags is None:
                        tags = self.tags_code(topic, properties, store_ts)
            if cq.put_unit(phy_offset, size, tags, queue_offset):
                queues.mark_dirty(cq)
            table = self.commit_log.topic_queue_table
            if table.get(key, 0) <= queue_offset:
                table[key] = queue_offset + 1
        if self.index is not None and tran != SYSFLAG_TRANSACTION_ROLLBACK and properties:
            uniq = _prop(properties, _UNIQ_NEEDLE)
            raw = _prop(properties, _KEYS_NEEDLE)
            if raw:
                keys = [uniq] if uniq else []
                keys.extend(k for k in raw.split(KEY_SEPARATOR) if k)
                if keys:
                    self.index.build_index(topic, keys, phy_offset, store_ts)
            elif uniq:
                self.index.build_index_one(topic, uniq, phy_offset, store_ts)
        self.last_dispatch_timestamp = store_ts
        self.dispatched_total += 1

    def dispatch_run(self, metas: list[RecordMeta]) -> None:
        """``dispatch`` for consecutive records (ascending phy offsets): the same consume queue units,
        table updates and index entries, with a queue's consecutive units written by one ``put_units``."""
        queues = self.queues
        table = self.commit_log.topic_queue_table
        index = self.index
        tags_cache = self._tags_codes
        topic_ok = self._topic_ok
        cq = None
        cq_key: tuple[str, int] | None = None
        units: list[tuple[int, int, int]] = []
        first_qo = next_qo = 0
        index_items: list[tuple[str, str, int, int]] = []
        for meta in metas:
            phy_offset, size, topic, queue_id, queue_offset, store_ts, sys_flag, properties = meta
            tran = sys_flag & SYSFLAG_TRANSACTION_MASK
            if tran not in _NO_CQ:
                ok = topic_ok.get(topic)
                if ok is None:
                    ok = topic_dir_name_ok(topic)
                    if len(topic_ok) < 10_000:
                        topic_ok[topic] = ok
                if ok:
                    if topic == SCHEDULE_TOPIC or not properties:
                        tags = self.tags_code(topic, properties, store_ts)
                    else:
                        tags_text = _prop(properties, _TAGS_NEEDLE)
                        if not tags_text:
                            tags = 0
                        else:
                            tags = tags_cache.get(tags_text)  # type: ignore[assignment]
                            if tags is None:
                                tags = self.tags_code(topic, properties, store_ts)
                    key = (topic, queue_id)
                    if key != cq_key or queue_offset != next_qo or len(units) >= DISPATCH_RUN_UNITS_MAX:
                        if cq is not None and units and cq.put_units(first_qo, units):
                            queues.mark_dirty(cq)
                        cq_key = key
                        cq = queues.queues.get(key) or queues.get_or_create(topic, queue_id)
                        units = []
                        first_qo = queue_offset
                    units.append((phy_offset, size, tags))
                    next_qo = queue_offset + 1
                    if table.get(key, 0) <= queue_offset:
                        table[key] = next_qo
            if index is not None and tran != SYSFLAG_TRANSACTION_ROLLBACK and properties:
                uniq = _prop(properties, _UNIQ_NEEDLE)
                if uniq:
                    index_items.append((topic, uniq, phy_offset, store_ts))
                raw = _prop(properties, _KEYS_NEEDLE)
                if raw:
                    index_items.extend((topic, k, phy_offset, store_ts) for k in raw.split(KEY_SEPARATOR) if k)
            self.last_dispatch_timestamp = store_ts
        if cq is not None and units and cq.put_units(first_qo, units):
            queues.mark_dirty(cq)
        if index is not None and index_items:
            index.build_index_many(index_items)
        self.dispatched_total += len(metas)

    def reput(self, max_records: int | None = None, budget_s: float | None = None) -> int:
        """Dispatch complete records from ``reput_phy_offset`` on; returns how many. When a consume queue
        file cannot be created, opened or reserved (a full disk, no descriptor left) the dispatch stops at that
        record, ``stalled_reason`` says why, and the next reput tries again (units already written are skipped
        then: queue offsets only grow); the broker retries on a timer until it succeeds.
        With ``budget_s`` the reput stops once it has run that long (``cut_short``: records are left, and the
        broker's loop runs the next step after other work), so no dispatch holds the event loop for long."""
        self.cut_short = False
        try:
            count = self._reput(max_records, budget_s)
        except StoreError as exc:
            reason = str(exc)
            now_s = time.monotonic()
            if reason != self.stalled_reason or now_s - self._stall_logged_at_s >= STALL_LOG_INTERVAL_S:
                self._stall_logged_at_s = now_s
                log.error("dispatch paused at phy offset %d (retried until it succeeds): %s",
                          self.reput_phy_offset, reason)
            self.stalled_reason = reason
            return 0
        if self.stalled_reason:
            log.warning("dispatch resumed at phy offset %d", self.reput_phy_offset)
            self.stalled_reason = ""
        return count

    def _reput(self, max_records: int | None, budget_s: float | None = None) -> int:
        limit = _UNLIMITED if max_records is None else max_records
        if self.native is not None:
            return self._reput_native(limit, budget_s)
        deadline = None if budget_s is None else time.perf_counter() + budget_s
        cl = self.commit_log
        pending = cl.pending
        max_phy = self.reput_end_phy_offset()
        if self.reput_phy_offset < cl.min_offset:
            self.reput_phy_offset = cl.min_offset
        count = 0
        while count < limit and self.reput_phy_offset < max_phy:
            if deadline is not None and count and time.perf_counter() >= deadline:
                self.cut_short = True
                break
            r = self.reput_phy_offset
            if pending:
                head = pending[0]
                if head.phy_offset < r:
                    pending.popleft()
                    continue
                if head.phy_offset == r:
                    if r + head.size > max_phy:
                        break  # beyond reput_end: not confirmed yet
                    # the run of pending metas that continue each other, dispatched together
                    run = [pending.popleft()]
                    r += head.size
                    n = 1
                    while pending and n < limit - count and n < DISPATCH_RUN_RECORDS_MAX and r < max_phy:
                        head = pending[0]
                        if head.phy_offset != r or r + head.size > max_phy:
                            break
                        run.append(pending.popleft())
                        r += head.size
                        n += 1
                    if n == 1:  # a lone record: the plain path has less set-up
                        self.dispatch(run[0], run[0].phy_offset)
                    else:
                        self.dispatch_run(run)
                    self.reput_phy_offset = r
                    count += n
                    continue
            mf = cl.mfq.find(r)
            if mf is None:
                break
            pos = r - mf.file_from_offset
            wrote = min(mf.wrote_position, max_phy - mf.file_from_offset)  # (records end at reput_end at most)
            status, size, meta = check_record_meta(mf.mm, pos, wrote)
            if meta is not None:  # RecordCheck.OK
                self.dispatch(meta, r)
                count += 1
                # the records right behind it in this segment: no per-record segment lookup
                mm = mf.mm
                r += size
                pos += size
                self.reput_phy_offset = r
                parsed: list[RecordMeta] = []  # dispatched together, DISPATCH_RUN_RECORDS_MAX at a time
                while count < limit and r < max_phy and not pending:
                    status, size, meta = check_record_meta(mm, pos, wrote)
                    if meta is None:
                        break  # the outer loop looks at this position again and decides
                    if meta.phy_offset != r:  # dispatch() indexes the position, not the stored field
                        meta = meta._replace(phy_offset=r)
                    parsed.append(meta)
                    count += 1
                    r += size
                    pos += size
                    if len(parsed) >= DISPATCH_RUN_RECORDS_MAX:
                        break  # dispatched below; the outer loop looks at the budget, then goes on from r
                if parsed:
                    self.dispatch_run(parsed)
                self.reput_phy_offset = r
            elif status is RecordCheck.BLANK:
                self.reput_phy_offset = mf.end_offset
            else:
                if status is RecordCheck.CORRUPT and self._corrupt_logged_at != r:
                    self._corrupt_logged_at = r
                    log.error("reput stopped: corrupt record at phy offset %d", r)
                break
        return count

    # --- native path ---------------------------------------------------------------------------

    def _reput_native(self, limit: int, budget_s: float | None = None) -> int:
        """``reput`` by native scans of the commit log; each record a scan leaves is dispatched by
        ``_reput_one`` (the parse path's rules), then the scan goes on behind it."""
        native = self.native
        assert native is not None
        cl = self.commit_log
        if cl.pending:
            cl.pending.clear()  # metas queued before the switch: the bytes say the same
        max_phy = self.reput_end_phy_offset()
        if self.reput_phy_offset < cl.min_offset:
            self.reput_phy_offset = cl.min_offset
        want_index = self.index is not None
        count = 0
        clock = time.perf_counter
        started = clock()
        deadline = None if budget_s is None else started + budget_s
        max_window = NATIVE_SCAN_RECORDS_MAX
        while count < limit and self.reput_phy_offset < max_phy:
            r = self.reput_phy_offset
            mf = cl.mfq.find(r)
            if mf is None:
                break
            base = mf.file_from_offset
            end = min(mf.wrote_position, max_phy - base)
            window = min(limit - count, self._scan_window if budget_s is not None else max_window)
            records, end_pos, last_ts, stop, runs, entries = native.scan_dispatch(
                mf.mm, r - base, end, window, base, want_index)
            if records:
                self._apply_scan(native, runs, entries)
                self.last_dispatch_timestamp = last_ts
                self.dispatched_total += records
                self.reput_phy_offset = base + end_pos
                count += records
                if budget_s is not None:  # a window's time follows its size: keep one well inside the budget
                    now = clock()
                    took, started = now - started, now
                    if took * 4 > budget_s and self._scan_window > NATIVE_SCAN_RECORDS_MIN:
                        self._scan_window //= 2
                    elif took * 16 < budget_s and self._scan_window < max_window:
                        self._scan_window *= 2
                    if deadline is not None and now >= deadline and count < limit:
                        self.cut_short = self.reput_phy_offset < max_phy
                        break
                if stop != speedups.SCAN_STOP_RECORD or count >= limit:
                    continue  # a full window (or the end): scan on
            # the record at end_pos is not for the scan (or nothing was readable): the parse path decides
            done = self._reput_one(mf, base + end_pos, end)
            if done < 0:
                break
            count += done
        return count

    def _apply_scan(self, native: ModuleType, runs: list[tuple[str, int, int, bytes]], entries: bytes) -> None:
        """Write a scan's consume queue runs (in scan order per queue), table updates and index entries."""
        queues = self.queues
        find = queues.queues.get
        mark_dirty = queues.mark_dirty
        table = self.commit_log.topic_queue_table
        for topic, queue_id, first_queue_offset, units in runs:
            key = (topic, queue_id)
            cq = find(key) or queues.get_or_create(topic, queue_id)
            if cq.put_units_packed(first_queue_offset, units):
                mark_dirty(cq)
            next_queue_offset = first_queue_offset + len(units) // CQ_STORE_UNIT_SIZE
            if table.get(key, 0) < next_queue_offset:
                table[key] = next_queue_offset
        if entries and self.index is not None:
            self.index.build_index_packed(native, entries)

    def _reput_one(self, mf: MappedFile, r: int, end: int) -> int:
        """The parse path for the one record at ``r`` in ``mf`` (readable up to position ``end``): 1 if
        dispatched, 0 if skipped (BLANK: on to the next segment), -1 to stop (END, INCOMPLETE, CORRUPT)."""
        status, size, meta = check_record_meta(mf.mm, r - mf.file_from_offset, end)
        if meta is not None:  # RecordCheck.OK
            self.dispatch(meta, r)
            self.reput_phy_offset = r + size
            return 1
        if status is RecordCheck.BLANK:
            self.reput_phy_offset = mf.end_offset
            return 0
        if status is RecordCheck.CORRUPT and self._corrupt_logged_at != r:
            self._corrupt_logged_at = r
            log.error("reput stopped: corrupt record at phy offset %d", r)
        return -1
