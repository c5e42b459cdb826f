"""``MessageStore``: the store facade (synchronous, single writer; ``flush*`` may run on another
thread). The commit log is the source of truth; consume queues and the index are derived from it
by ``reput`` and rebuilt from it by recovery. See docs/store-format.md.
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable

from ferrymq.common.message import (
    SYSFLAG_TRANSACTION_MASK,
    SYSFLAG_TRANSACTION_PREPARED,
    SYSFLAG_TRANSACTION_ROLLBACK,
    MessageExt,
    MessageExtBrokerInner,
)
from ferrymq.common.message_codec import RecordCheck, RecordFormatError, check_record, decode_record
from ferrymq.store.checkpoint import (
    QueueMark,
    StoreCheckpoint,
    abort_file_exists,
    append_queue_offsets,
    create_abort_file,
    fsync_dir,
    read_index_manifest,
    read_queue_marks,
    remove_abort_file,
    write_index_manifest,
    write_queue_offsets_tmp,
)
from ferrymq.store.commit_log import CommitLog
from ferrymq.store.config import CQ_STORE_UNIT_SIZE, StoreConfig
from ferrymq.store.consume_queue import ConsumeQueue
from ferrymq.store.dispatch import Dispatcher
from ferrymq.store.errors import (
    StoreConfigMismatchError,
    StoreDirError,
    StoreDiskFullError,
    StoreError,
    StoreLockedError,
    StoreOpenFilesError,
)
from ferrymq.store.filter import MessageFilter
from ferrymq.store.index import IndexService
from ferrymq.store.mapped_file import MappedFile
from ferrymq.store.queue_table import ConsumeQueueTable, make_consume_queue_file
from ferrymq.store.reader import StoreReader
from ferrymq.store.recovery import rebuild_missing_index, rebuild_short_queues, recover
from ferrymq.store.results import (
    GetMessageResult,
    PutMessageResult,
    PutMessageStatus,
    QueryMessageResult,
)

log = logging.getLogger(__name__)

_HOUR_MS = 3_600_000
#: the queue offsets snapshot (recovery's way to tell a consume queue deleted on disk) gets, every consume queue
#: flush, one line per queue that flush wrote (before the checkpoint, so the two agree); the consume queue flush
#: rewrites it whole once the lines appended since exceed the number of queues, and at least this many
QUEUE_OFFSETS_COMPACT_MIN_LINES = 10_000
#: a put refused because a consume queue file cannot be had is logged at most once per this interval
PUT_REFUSED_LOG_INTERVAL_S = 5.0
#: entries of ``LogFloor.premade`` at most (files made ahead whose queue never opened them stay until then)
PREMADE_FILES_MAX = 100_000
#: queues whose prepared consume queue file ``prepare_put`` remembers (its check without a call into the queue:
#: the file is still mapped and its reserved blocks reach the next unit); cleared when full, so at most this many
#: entries whatever the number of queues
PREPARED_QUEUES_MAX = 4096
_NO_CQ = (SYSFLAG_TRANSACTION_PREPARED, SYSFLAG_TRANSACTION_ROLLBACK)
#: the ``queueoffsets`` line of a deleted queue (no expectation)
_DELETED_MARK: QueueMark = (0, 0, 0)

#: answers the lowest commit log phy offset some subscribed group has not consumed yet, or None when every
#: subscribed group has consumed everything (or none is known); supplied by the broker (``MessageStore.
#: unconsumed_phy_floor``), called only by the cleanup when it considers deleting a segment
UnconsumedFloorProvider = Callable[[], "int | None"]


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


def check_segment_size(commit_log_dir: str, configured_bytes: int) -> None:
    """StoreConfigMismatchError if the commit log on disk was written with another segment size: its first
    segment is of another size, and so is the second (unless the first is the only one and shorter: a torn newest
    segment, which loading extends with zeros; a lone odd first segment is damage). One listing, two ``stat``."""
    try:
        names = sorted(n for n in os.listdir(commit_log_dir) if len(n) == 20 and n.isdigit())
    except OSError:
        return  # no commit log yet (or unreadable: the segment loading reports it)
    if not names:
        return
    first = os.path.join(commit_log_dir, names[0])
    try:
        found = os.path.getsize(first)
    except OSError:
        return
    if found == configured_bytes or (found < configured_bytes and len(names) == 1):
        return
    if len(names) > 1:
        # the second segment must agree (it may be a torn, shorter newest one); a lone odd first segment is
        # damage, which loading reports
        try:
            second = os.path.getsize(os.path.join(commit_log_dir, names[1]))
        except OSError:
            return
        if not (second == found or (len(names) == 2 and second < found)):
            return
    raise StoreConfigMismatchError(
        "mappedFileSizeCommitLog",
        f"the commit log in {commit_log_dir} was written with {found}-byte segments ({names[0]}), this broker "
        f"is configured for {configured_bytes}; set mappedFileSizeCommitLog={found} to open it")


def disk_used_ratio(st: os.statvfs_result) -> float:
    """Percent of a file system in use as ``df`` shows it: used / (used + available to unprivileged users), where
    used = (f_blocks - f_bfree) x f_frsize and available = f_bavail x f_frsize. Blocks reserved for root count in
    neither (1 - f_bavail / f_blocks would count them as used: 85% where ``df`` says 63%)."""
    used = (st.f_blocks - st.f_bfree) * st.f_frsize
    avail = st.f_bavail * st.f_frsize
    return 100.0 * used / (used + avail) if used + avail > 0 else 0.0


class MessageStore:
    def __init__(self, config: StoreConfig, clock_ms: Callable[[], int] = wall_clock_ms) -> None:
        self.config = config
        self.clock_ms = clock_ms
        self.commit_log = CommitLog(config, clock_ms)
        self.commit_log.accepting_puts = False  # until load(); kept equal to _running and not disk_full
        #: the file system is past disk_space_warning_level_ratio (check_disk_space): puts are refused
        self._disk_full = False
        self.queues = ConsumeQueueTable(
            config.store_path_consume_queue, config.mapped_file_size_consume_queue, config.max_open_segment_files
        )
        self.index: IndexService | None = (
            IndexService(config.store_path_index, config.index_hash_slot_num, config.index_max_num, clock_ms)
            if config.message_index_enable
            else None
        )
        self.dispatcher = Dispatcher(config, self.commit_log, self.queues, self.index)
        self.reader = StoreReader(config, self.commit_log, self.queues, self.index)
        self.checkpoint: StoreCheckpoint | None = None
        self.boot_timestamp = 0
        self.last_start_was_abnormal = False
        self._lock_fd = -1
        self._running = False
        #: held while the checkpoint is written (flush_consume_queues) and for all of truncate_to, so a flush
        #: thread never writes a dispatched offset beyond a cut being made
        self._checkpoint_lock = threading.Lock()
        self._put_refused_logged_at_s = -PUT_REFUSED_LOG_INTERVAL_S
        #: (topic, queue id) -> the last consume queue file ``prepare_put`` prepared for it (see ``prepare_put``)
        self._prepared_files: dict[tuple[str, int], MappedFile] = {}
        #: where subscribed groups stand (the broker's offsets); None: no group protects any segment
        self.unconsumed_phy_floor: UnconsumedFloorProvider | None = None
        #: records that must be kept whatever retention and disk pressure say (the broker's pending timer
        #: messages): no segment at or above this phy offset is deleted; None: nothing is held
        self.retained_phy_floor: UnconsumedFloorProvider | None = None
        #: a segment retention would delete is held by ``retained_phy_floor`` (logged once per episode)
        self.retention_held = False
        #: percent of the store's file system in use at the last check_disk_space (-1: not measured yet)
        self.disk_used_pct = -1.0
        #: the forced cleanup found nothing it may delete (logged once per episode)
        self._forced_cleanup_blocked = False
        #: serialises writes of the queue offsets snapshot (the flush thread's appends and rewrites, a topic
        #: deletion's lines from the writer's thread); held only around short file operations
        self._queue_offsets_lock = threading.Lock()
        #: lines appended to the snapshot since it was last written whole
        self._queue_offsets_lines = 0
        #: queues deleted while a whole snapshot was being built (left out of it)
        self._queue_offsets_deleted: set[tuple[str, int]] = set()
        #: the index files (name, begin phy offset) the manifest on disk lists (None: not written yet)
        self._index_manifest: list[tuple[str, int]] | None = None
        self.queues.floor.on_mismatch = self._queue_loaded_unlike_snapshot

    # --- lifecycle ---------------------------------------------------------------------------

    def load(self) -> None:
        """Create dirs, lock, recover (abnormal if the abort file exists), create the abort file."""
        c = self.config
        try:
            for path in (c.store_path_root_dir, c.store_path_commit_log, c.store_path_consume_queue):
                os.makedirs(path, exist_ok=True)
            if self.index is not None:
                os.makedirs(c.store_path_index, exist_ok=True)
            self._lock_fd = os.open(c.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise StoreDirError(f"unusable store directory {c.store_path_root_dir}: {exc}") from exc
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(self._lock_fd)
            self._lock_fd = -1
            raise StoreLockedError(f"store {c.store_path_root_dir} is locked by another process") from exc
        try:
            self._load_files()
        except BaseException:
            self._close_files()
            raise
        self.boot_timestamp = self.clock_ms()
        self._running = self.commit_log.accepting_puts = True
        self._disk_full = False

    def _load_files(self) -> None:
        c = self.config
        abnormal = abort_file_exists(c.abort_path)
        self.last_start_was_abnormal = abnormal
        self.checkpoint = StoreCheckpoint(c.checkpoint_path)
        check_segment_size(c.store_path_commit_log, c.mapped_file_size_commit_log)
        self.commit_log.mfq.load()
        # the queues the snapshot accounts for are not opened here but on their first use (consume_queue.py)
        marks = read_queue_marks(c.queue_offsets_path)
        self.queues.load(marks)
        if self.index is not None:
            self.index.load()
        reput_from = recover(c, self.commit_log, self.queues, self.checkpoint, abnormal)
        # a consume queue or an index file deleted or cut on disk is rebuilt whatever the checkpoint says
        expected = {key: mark[0] for key, mark in marks.items()} if marks else {}
        rebuild_short_queues(self.commit_log, self.queues, expected, reput_from, self.dispatcher.tags_code)
        del marks, expected
        if self.index is not None:
            rebuild_missing_index(
                self.commit_log, self.index,
                read_index_manifest(c.index_manifest_path, c.index_hash_slot_num, c.index_max_num), reput_from)
        self.commit_log.replica_verified_phy = self.commit_log.max_offset  # recovered: checked by the walk
        self.dispatcher.reput_phy_offset = reput_from
        create_abort_file(c.abort_path)
        self.dispatcher.reput()  # catch up before serving
        self._write_queue_offsets(self._queue_offsets())
        self._write_index_manifest()
        log.info(
            "store loaded (%s start): commit log [%d, %d), %d consume queues (%d opened, the rest on first use)",
            "abnormal" if abnormal else "normal", self.min_phy_offset, self.max_phy_offset,
            len(self.queues.queues), self.queues.loaded_count,
        )  # fmt: skip

    def _queue_loaded_unlike_snapshot(self, cq: ConsumeQueue, expected_units: int, recorded_end_phy: int) -> None:
        """A queue loaded on its first use holds another number of units than the ``queueoffsets`` snapshot said.
        Fewer (a file cut or zeroed on disk while the store was down): rebuild the missing units from the commit log
        now, walking only the stretch between its newest unit and the record the snapshot named as its newest. More
        (units the snapshot did not see): the next queue offset of the queue follows them."""
        key = (cq.topic, cq.queue_id)
        units = cq.max_offset_in_queue
        if units > expected_units:
            table = self.commit_log.topic_queue_table
            if table.get(key, 0) < units:
                if self._running:  # at start: units written after the queue's last flush, re-dispatched anyway
                    log.warning("consume queue %s/%d holds %d units, its snapshot line %d: its next queue offset "
                                "follows the queue", cq.topic, cq.queue_id, units, expected_units)
                table[key] = units
            return
        until = min(recorded_end_phy, self.dispatcher.reput_phy_offset) if recorded_end_phy > 0 \
            else self.dispatcher.reput_phy_offset
        rebuild_short_queues(self.commit_log, self.queues, {key: expected_units}, until, self.dispatcher.tags_code)

    def shutdown(self) -> None:
        """Flush everything, write the checkpoint, remove the abort file, close the files."""
        if not self._running:
            return
        self._running = self.commit_log.accepting_puts = False
        self.commit_log.flush()
        self.dispatcher.reput()
        self.flush_consume_queues()
        self._write_queue_offsets(self._queue_offsets())
        self._write_index_manifest()
        remove_abort_file(self.config.abort_path)
        self._close_files()

    def close_abruptly(self) -> None:
        """Release files as a crash would: no flush, no checkpoint, the abort file stays.
        (For fault-injection tests; data already in the page cache still reaches the files.)"""
        self._running = self.commit_log.accepting_puts = False
        self._close_files()

    def _close_files(self) -> None:
        self.commit_log.mfq.close()
        self.queues.close()
        if self.index is not None:
            self.index.close()
        if self.checkpoint is not None:
            self.checkpoint.close()
        if self._lock_fd >= 0:
            os.close(self._lock_fd)  # releases the flock
            self._lock_fd = -1

    @property
    def running(self) -> bool:
        return self._running

    # --- write path --------------------------------------------------------------------------

    @property
    def disk_full(self) -> bool:
        return self._disk_full or self.commit_log.out_of_space

    @disk_full.setter
    def disk_full(self, value: bool) -> None:
        self._disk_full = value

    def put_message(self, inner: MessageExtBrokerInner) -> PutMessageResult:
        if not self._running or self.config.is_slave:
            return PutMessageResult(PutMessageStatus.SERVICE_NOT_AVAILABLE)
        if self.disk_full:
            return PutMessageResult(PutMessageStatus.DISK_FULL)
        return self.commit_log.put_message(inner)

    def put_messages(self, inners: list[MessageExtBrokerInner]) -> PutMessageResult:
        if not self._running or self.config.is_slave:
            return PutMessageResult(PutMessageStatus.SERVICE_NOT_AVAILABLE)
        if self.disk_full:
            return PutMessageResult(PutMessageStatus.DISK_FULL)
        return self.commit_log.put_messages(inners)

    def put_batch_raw(self, topic: str, queue_id: int, batch_body: bytes, merge_props: bytes, cluster: bytes,
                      sys_flag: int, born_timestamp: int, born_host: bytes, store_host: bytes,
                      reconsume_times: int) -> PutMessageResult | None:
        """``CommitLog.put_batch_raw`` (the native SEND_BATCH put); None = use ``put_messages``."""
        if not self._running or self.config.is_slave or self.disk_full:
            return None  # put_messages answers SERVICE_NOT_AVAILABLE
        return self.commit_log.put_batch_raw(topic, queue_id, batch_body, merge_props, cluster, sys_flag,
                                             born_timestamp, born_host, store_host, reconsume_times)

    def put_one_raw(self, topic: str, queue_id: int, body: bytes, props: bytes, cluster: bytes, flag: int,
                    sys_flag: int, born_timestamp: int, born_host: bytes, store_host: bytes,
                    reconsume_times: int) -> tuple[PutMessageResult, bool] | None:
        """``CommitLog.put_one_raw`` (the native single SEND put); None = use ``put_message`` (which answers
        SERVICE_NOT_AVAILABLE when the store is not running or a slave: the commit log declines those itself,
        ``accepting_puts`` follows ``running``)."""
        return self.commit_log.put_one_raw(topic, queue_id, body, props, cluster, flag, sys_flag, born_timestamp,
                                           born_host, store_host, reconsume_times)

    def prepare_put(self, topic: str, queue_id: int, sys_flag: int) -> PutMessageStatus | None:
        """Before a put to (topic, queue_id): make sure its consume queue unit can be written (the file
        exists, is mapped, its blocks reserved), so a put is only acknowledged when its dispatch can be made.
        None if so (or nothing to prepare), else the status refusing the put.

        Once per send, so the usual case is checked here without a call: the file the last preparation of this
        queue found is still mapped and open, and its reserved blocks reach past the next unit (then
        ``ConsumeQueue.prepare_unit`` would do nothing but move it up the open-file pool's order, which the
        dispatch's write into it does anyway). Anything else (a new queue, the next file, a released or closed
        file, a chunk to reserve) takes the full preparation."""
        key = (topic, queue_id)
        mf = self._prepared_files.get(key)
        if mf is not None and not mf.mm.closed and not mf.closed:
            rel = self.commit_log.topic_queue_table.get(key, 0) * CQ_STORE_UNIT_SIZE - mf.file_from_offset
            if 0 <= rel <= mf.reserved_position - CQ_STORE_UNIT_SIZE:
                return None
        if (sys_flag & SYSFLAG_TRANSACTION_MASK) in _NO_CQ or self._put_prepares_nothing(topic, queue_id):
            return None  # no consume queue unit / the put itself refuses
        try:
            self.queues.prepare_unit(topic, queue_id, self.commit_log.topic_queue_table.get(key, 0))
        except StoreError as exc:
            return self._refuse_put(key, exc)
        cq = self.queues.queues.get(key)
        last = cq.mfq.last() if cq is not None else None
        if last is not None:
            prepared = self._prepared_files
            if len(prepared) >= PREPARED_QUEUES_MAX and key not in prepared:
                prepared.clear()
            prepared[key] = last
        return None

    def _put_prepares_nothing(self, topic: str, queue_id: int) -> bool:
        """A put to (topic, queue_id) now would be refused by the put itself (not running, a slave, a full disk, a
        bad topic or queue id): there is no consume queue file to prepare for it."""
        return (not self._running or self.config.is_slave or self.disk_full or not 0 <= queue_id < 1 << 31
                or self.commit_log._encode_topic(topic) is None)

    def _refuse_put(self, key: tuple[str, int], exc: StoreError) -> PutMessageStatus:
        status = (PutMessageStatus.DISK_FULL if isinstance(exc, StoreDiskFullError)
                  else PutMessageStatus.OPEN_FILES_EXHAUSTED if isinstance(exc, StoreOpenFilesError)
                  else PutMessageStatus.CREATE_MAPEDFILE_FAILED)
        now_s = time.monotonic()
        if now_s - self._put_refused_logged_at_s >= PUT_REFUSED_LOG_INTERVAL_S:
            self._put_refused_logged_at_s = now_s
            log.error("send to %s queue %d refused (%s): %s", key[0], key[1], status.name, exc)
        return status

    def reput(self, max_records: int | None = None, budget_s: float | None = None) -> int:
        return self.dispatcher.reput(max_records, budget_s)

    @property
    def reput_cut_short(self) -> bool:
        """The last reput stopped at its time budget with records left (``Dispatcher.cut_short``)."""
        return self.dispatcher.cut_short

    @property
    def max_phy_offset(self) -> int:
        return self.commit_log.max_offset

    @property
    def min_phy_offset(self) -> int:
        return self.commit_log.min_offset

    @property
    def reput_phy_offset(self) -> int:
        return self.dispatcher.reput_phy_offset

    @property
    def flushed_phy_offset(self) -> int:
        return self.commit_log.flushed_offset

    def reput_can_advance(self) -> bool:
        """Whether a reput now may dispatch anything: ``Dispatcher.reput_end`` (or the log's end) is past the
        reput offset. False while every new record waits for the confirm offset."""
        dispatcher = self.dispatcher
        return dispatcher.reput_end_phy_offset() > dispatcher.reput_phy_offset

    @property
    def dispatch_behind_bytes(self) -> int:
        """Bytes the dispatch could have reached and has not (records beyond ``Dispatcher.reput_end``, not
        confirmed yet, are not behind: they wait for the bound)."""
        return self.dispatcher.behind_bytes()

    def flush(self, least_pages: int = 0) -> int:
        """Persist the commit log up to the wrote position (or only if ≥ ``least_pages`` dirty
        pages). Thread-safe against the writer. Returns the flushed phy offset."""
        ts = self.commit_log.last_store_timestamp
        flushed = self.commit_log.flush(least_pages)
        if self.checkpoint is not None and flushed >= self.max_phy_offset:
            self.checkpoint.physic_msg_timestamp = ts
        return flushed

    def flush_consume_queues(self) -> None:
        """Persist consume queues and index, then the checkpoint (thread-safe against the writer)."""
        with self._checkpoint_lock:
            self._flush_consume_queues()

    def consume_queue_file_to_make(self, topic: str, queue_id: int) -> str | None:
        """The consume queue file a put to (topic, queue_id) now would have to create first (a queue's first file),
        or None: for a caller that has ``make_consume_queue_file`` make it on a thread before the put, so the
        event loop does not wait on the file system's directory, inode and block allocations. Asks nothing of the
        file system; None where a put would be refused or stores no unit anyway."""
        if self._put_prepares_nothing(topic, queue_id):
            return None
        return self.queues.file_to_make(topic, queue_id, self.commit_log.topic_queue_table.get((topic, queue_id), 0))

    def make_consume_queue_file(self, path: str) -> bool:
        """Thread-safe: ``queue_table.make_consume_queue_file`` with this store's consume queue file size; True if
        it made the file (its reserved blocks are then handed to the queue that opens it: ``LogFloor.premade``)."""
        reserved = make_consume_queue_file(path, self.config.mapped_file_size_consume_queue)
        if reserved < 0:
            return False
        if reserved > 0:
            premade = self.queues.floor.premade
            if len(premade) < PREMADE_FILES_MAX:
                premade[path] = reserved
        return True

    def _flush_consume_queues(self) -> None:
        """Queues written since the last round (their lines appended to the queue offsets snapshot), the index
        (its manifest when files came or went), then the checkpoint: what the checkpoint says is dispatched,
        the snapshot and the manifest account for. O(queues written), not O(queues): the whole snapshot is
        rewritten (here, on the flush thread) only once the appended lines outgrow it."""
        reput = self.dispatcher.reput_phy_offset
        dispatch_ts = self.dispatcher.last_dispatch_timestamp
        offsets = None
        if self._queue_offsets_lines > max(QUEUE_OFFSETS_COMPACT_MIN_LINES, len(self.queues.queues)):
            offsets = self._queue_offsets()  # taken before the flush: every unit it counts is flushed below
        flushed = self.queues.flush()
        if offsets is not None:
            self._write_queue_offsets(offsets)
        elif flushed:
            self._append_queue_offsets(flushed)
        if self.index is not None:
            self.index.flush()
            if self._index_manifest != self.index.manifest():
                self._write_index_manifest()
        cp = self.checkpoint
        if cp is None:
            return
        cp.dispatched_phy_offset = min(reput, self.commit_log.flushed_offset)
        cp.logics_msg_timestamp = dispatch_ts
        cp.index_msg_timestamp = dispatch_ts
        cp.data_start_phy_offset = self.commit_log.data_start_phy_offset
        cp.flush()

    # --- read path ---------------------------------------------------------------------------

    def get_message(
        self, group: str, topic: str, queue_id: int, queue_offset: int, max_msg_nums: int,
        message_filter: MessageFilter | None,
    ) -> GetMessageResult:  # fmt: skip
        return self.reader.get_message(topic, queue_id, queue_offset, max_msg_nums, message_filter)

    def get_max_offset_in_queue(self, topic: str, queue_id: int) -> int:
        cq = self.queues.find(topic, queue_id)
        return cq.max_offset_in_queue if cq is not None else 0

    def get_min_offset_in_queue(self, topic: str, queue_id: int) -> int:
        cq = self.queues.find(topic, queue_id)
        return cq.min_offset_in_queue if cq is not None else 0

    def get_offset_in_queue_by_time(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        cq = self.queues.find(topic, queue_id)
        return self.reader.offset_by_time(cq, timestamp_ms) if cq is not None else 0

    def get_earliest_message_time(self, topic: str, queue_id: int) -> int:
        return self.get_message_store_timestamp(
            topic, queue_id, self.get_min_offset_in_queue(topic, queue_id)
        )

    def get_message_store_timestamp(self, topic: str, queue_id: int, queue_offset: int) -> int:
        cq = self.queues.find(topic, queue_id)
        ts = self.reader.queue_store_timestamp(cq, queue_offset) if cq is not None else None
        return -1 if ts is None else ts

    def look_message_by_offset(self, phy_offset: int) -> MessageExt | None:
        record = self.reader.select_one(phy_offset)
        if record is None:
            return None
        try:
            return decode_record(record)
        except RecordFormatError:
            return None

    def select_one_message_by_offset(self, phy_offset: int) -> bytes | None:
        return self.reader.select_one(phy_offset)

    def query_message(
        self, topic: str, key: str, max_num: int, begin_timestamp_ms: int, end_timestamp_ms: int
    ) -> QueryMessageResult:
        return self.reader.query_message(topic, key, max_num, begin_timestamp_ms, end_timestamp_ms)

    def get_consume_queue_units(
        self, topic: str, queue_id: int, queue_offset: int, max_count: int
    ) -> list[tuple[int, int, int]]:
        """(phy_offset, size, tags_code) for up to ``max_count`` units from ``queue_offset``."""
        cq = self.queues.find(topic, queue_id)
        if cq is None or max_count <= 0:
            return []
        start = max(queue_offset, cq.min_offset_in_queue)
        end = min(cq.max_offset_in_queue, queue_offset + max_count)
        units: list[tuple[int, int, int]] = []
        for off in range(start, end):
            unit = cq.get_unit(off)
            if unit is not None:
                units.append(unit)
        return units

    def topic_queue_ids(self) -> dict[str, list[int]]:
        return self.queues.topic_queue_ids()

    def queue_count(self, topic: str) -> int:
        """1 + the highest queue id of ``topic`` with a consume queue here (0: the store holds none)."""
        return self.queues.queue_count(topic)

    def delete_topic(self, topic: str) -> None:
        """Delete the topic's consume queues (O(its queues)); the queue offsets snapshot records them as gone, so
        recovery does not rebuild them."""
        keys = self.queues.delete_topic(topic)
        for key in keys:
            self.commit_log.topic_queue_table.pop(key, None)
        if keys:
            with self._queue_offsets_lock:
                self._queue_offsets_deleted.update(keys)
                self._append_queue_offsets_locked(dict.fromkeys(keys, _DELETED_MARK))

    def _queue_offsets(self) -> dict[tuple[str, int], QueueMark]:
        """How far each consume queue reaches (the ``queueoffsets`` snapshot, checkpoint.py); O(queues) but opens
        nothing (a queue not loaded yet gives the line it was loaded from): at start, clean stop, truncation, and
        when the flush thread compacts the snapshot. Queues deleted from here on are left out when it is written
        (``_write_queue_offsets``)."""
        with self._queue_offsets_lock:
            self._queue_offsets_deleted.clear()
        # dict.copy() allocates nothing per entry, so no collection (whose callbacks may hand the GIL to the loop
        # thread, which adds and deletes queues) starts inside it, as one can inside list(d.items())
        return {key: mark for key, cq in self.queues.queues.copy().items() if (mark := cq.mark())[0] > 0}

    def _write_queue_offsets(self, offsets: dict[tuple[str, int], QueueMark]) -> None:
        """Rewrite the snapshot whole: written into a temporary file without the lock, renamed under it; queues
        deleted since ``offsets`` was taken get their lines appended to it first."""
        path = self.config.queue_offsets_path
        tmp = path + ".tmp"
        try:
            write_queue_offsets_tmp(tmp, offsets)
            with self._queue_offsets_lock:
                deleted = self._queue_offsets_deleted
                if deleted:
                    append_queue_offsets(tmp, dict.fromkeys(deleted, _DELETED_MARK))
                    deleted.clear()
                os.replace(tmp, path)
                self._queue_offsets_lines = 0
            fsync_dir(os.path.dirname(path))
        except OSError as exc:
            log.warning("cannot write the queue offsets snapshot %s: %s", path, exc)

    def _append_queue_offsets(self, offsets: dict[tuple[str, int], QueueMark]) -> None:
        with self._queue_offsets_lock:
            self._append_queue_offsets_locked(offsets)

    def _append_queue_offsets_locked(self, offsets: dict[tuple[str, int], QueueMark]) -> None:
        try:
            self._queue_offsets_lines += append_queue_offsets(self.config.queue_offsets_path, offsets)
        except OSError as exc:
            log.warning("cannot append to the queue offsets snapshot %s: %s", self.config.queue_offsets_path, exc)

    def _write_index_manifest(self) -> None:
        """The index files manifest (checkpoint.write_index_manifest), when the index is on; tiny (one line per
        index file), rewritten only when files came or went."""
        index = self.index
        if index is None:
            return
        files = index.manifest()
        c = self.config
        try:
            write_index_manifest(c.index_manifest_path, c.index_hash_slot_num, c.index_max_num, files)
        except OSError as exc:
            log.warning("cannot write the index manifest %s: %s", c.index_manifest_path, exc)
            return
        self._index_manifest = files

    # --- HA ----------------------------------------------------------------------------------

    def read_from(self, phy_offset: int, max_bytes: int) -> bytes:
        return self.commit_log.read_from(phy_offset, max_bytes)

    def append_at(self, phy_offset: int, data: bytes) -> bool:
        was_empty = self.commit_log.mfq.last() is None
        ok = self.commit_log.append_at(phy_offset, data)
        if ok and was_empty:
            self.dispatcher.reput_phy_offset = self.commit_log.min_offset
            if self.commit_log.data_start_phy_offset and self.checkpoint is not None:
                self.checkpoint.data_start_phy_offset = self.commit_log.data_start_phy_offset
                self.checkpoint.flush()
        return ok

    def segment_start_of(self, phy_offset: int) -> int:
        return self.commit_log.segment_start_of(phy_offset)

    def truncate_to(self, phy_offset: int) -> None:
        """Drop every byte of the commit log at or after ``phy_offset`` and everything derived from it.

        Used by controller-mode HA when this replica's log diverged from the master's (the records after
        the last common epoch are cut). ``phy_offset`` must be a record boundary of this log (a record, a
        BLANK filler or unwritten zeros start there) or at / beyond a segment start; at or beyond the max
        phy offset nothing is cut. At or below the min phy offset the whole log goes (the next
        ``append_at`` starts it anew). Call it from the writer's thread; a concurrent flush thread waits.

        Steps, each leaving a store that recovery repairs to a consistent state if the process dies
        right after it (a crash simply resumes or undoes nothing; the log is either cut or not):

        1. the reput offset and the checkpoint's dispatched offset are lowered to ``phy_offset``
           (fdatasync): recovery never resumes beyond the cut, whatever happens next;
        2. the commit log: the segment holding the cut is zeroed from it (and synced), later segments are
           deleted; recovery's walk stops at the zeros and deletes whatever later segment a crash left;
        3. consume queue units pointing at or beyond the cut are removed (recovery does the same from
           the valid end), the next queue offsets and min offsets follow;
        4. index files that begin beyond the cut are deleted; entries of the file holding it stay, as
           every key lookup re-reads and checks the record it points at (reader.query_message);
        5. consume queues, index and checkpoint are flushed.
        """
        with self._checkpoint_lock:
            self._truncate_to(phy_offset)

    def _truncate_to(self, phy_offset: int) -> None:
        cl = self.commit_log
        if phy_offset < 0:
            raise StoreError(f"truncate_to: negative phy offset {phy_offset}")
        max_phy = cl.max_offset
        if phy_offset >= max_phy:
            return
        min_phy = cl.min_offset
        whole = phy_offset <= min_phy
        if not whole:
            self._check_boundary(phy_offset)
        cp = self.checkpoint
        dispatcher = self.dispatcher
        # 1. nothing may resume or claim dispatch beyond the cut
        dispatcher.reput_phy_offset = min(dispatcher.reput_phy_offset, phy_offset)
        if cp is not None and cp.dispatched_phy_offset > phy_offset:
            cp.dispatched_phy_offset = phy_offset
            cp.flush()
        # 2. the commit log
        mfq = cl.mfq
        with mfq._flush_lock:
            if whole:
                for mf in mfq.files:
                    mf.destroy()
                mfq.files = []
                mfq.flushed_where = 0
                cl.pending.clear()
                cl.data_start_phy_offset = 0
                cl.replica_verified_phy = 0
            else:
                cl.truncate(phy_offset)
                holder = mfq.last()
                if holder is not None:
                    holder.sync()
            fsync_dir(self.config.store_path_commit_log)
        dispatcher.reput_phy_offset = min(dispatcher.reput_phy_offset, cl.max_offset) if not whole else 0
        # 3. consume queues and the next queue offsets
        cut_queues = self.queues.truncate_dirty(phy_offset)
        new_min = cl.min_offset
        self.queues.correct_min_offsets(new_min)
        cl.topic_queue_table = {
            key: cq.max_offset_in_queue for key, cq in self.queues.queues.items() if cq.max_offset_in_queue > 0
        }
        # 4. the index
        if self.index is not None:
            self.index.truncate_to(phy_offset)
        # 5. persist
        for cq in cut_queues:
            last = cq.mfq.last()
            if last is not None:
                last.sync()
        self.queues.flush()
        if self.index is not None:
            self.index.flush()
        if cp is not None:
            cp.dispatched_phy_offset = min(cp.dispatched_phy_offset, phy_offset)
            cp.data_start_phy_offset = cl.data_start_phy_offset
            cp.flush()
        self._write_queue_offsets(self._queue_offsets())
        log.warning("store truncated to phy offset %d (was [%d, %d))", phy_offset, min_phy, max_phy)

    def _check_boundary(self, phy_offset: int) -> None:
        """Raise StoreError unless a record, a BLANK filler or zeros start at ``phy_offset``."""
        mf = self.commit_log.mfq.find(phy_offset)
        if mf is None:
            raise StoreError(f"truncate_to: phy offset {phy_offset} is outside the commit log")
        pos = phy_offset - mf.file_from_offset
        if pos == 0:
            return
        status, _size = check_record(mf.mm, pos, False, end=mf.file_size, expected_phy_offset=phy_offset)
        if status not in (RecordCheck.OK, RecordCheck.BLANK, RecordCheck.END):
            raise StoreError(f"truncate_to: phy offset {phy_offset} is not a record boundary ({status.value})")

    # --- retention & stats -------------------------------------------------------------------

    def check_disk_space(self) -> float:
        """Measure the store's file system (a ``statvfs``; the broker calls this every second) and act on it.
        Above ``disk_space_warning_level_ratio`` puts are refused (DISK_FULL) until usage falls below it; above
        ``disk_max_used_space_ratio`` expired segments are deleted now; above ``disk_space_clean_forcibly_ratio``
        the forced cleanup runs: with ``clean_file_forcibly_enable`` (RocketMQ's behaviour, opt-in) the oldest
        segment goes even before it expires, consumed or not (one per call, never the newest, never
        undispatched data); without it (the default) only segments older than ``file_reserved_time_hours``
        that every subscribed group has consumed, so a disk filled by others' files refuses sends instead of
        losing acknowledged messages. Reads are served throughout. Returns the percent in use, as ``df``
        shows it (``disk_used_ratio``)."""
        c = self.config
        if self.queues.expire_pending:  # the consume queue files of deleted segments, a bounded step a second
            self.queues.expire_step()
        try:
            st = os.statvfs(c.store_path_root_dir)
        except OSError as exc:
            log.error("cannot measure the store's disk: %s", exc)
            return -1.0
        used_pct = disk_used_ratio(st)
        self.disk_used_pct = used_pct
        # a segment that found no room keeps puts refused until usage falls below the warning level
        full = used_pct >= c.disk_space_warning_level_ratio
        self.commit_log.out_of_space = False
        if full != self._disk_full:
            if full:
                log.error("disk %.1f%% full (diskSpaceWarningLevelRatio %d%%): sends are refused until space "
                          "returns", used_pct, c.disk_space_warning_level_ratio)
            else:
                log.warning("disk %.1f%% full: sends are accepted again", used_pct)
        self._disk_full = full
        self.commit_log.accepting_puts = self._running and not full
        if used_pct >= c.disk_max_used_space_ratio:
            self.delete_expired_files()
        if used_pct < c.disk_space_clean_forcibly_ratio:
            self._forced_cleanup_blocked = False
        elif c.clean_file_forcibly_enable:
            if self.delete_expired_files(force_oldest=True):
                log.warning("disk %.1f%% full (diskSpaceCleanForciblyRatio %d%%, cleanFileForciblyEnable): deleted "
                            "the oldest commit log segment before it expired", used_pct,
                            c.disk_space_clean_forcibly_ratio)
        elif not self.delete_expired_files(only_consumed=True) and not self._forced_cleanup_blocked:
            self._forced_cleanup_blocked = True
            log.warning("disk %.1f%% full (diskSpaceCleanForciblyRatio %d%%): no commit log segment is both older "
                        "than fileReservedTime (%d h) and consumed by every subscribed group, so none is deleted; "
                        "sends are refused above diskSpaceWarningLevelRatio (%d%%). Free space on the disk, or set "
                        "cleanFileForciblyEnable=true to delete the oldest segment anyway", used_pct,
                        c.disk_space_clean_forcibly_ratio, c.file_reserved_time_hours,
                        c.disk_space_warning_level_ratio)
        return used_pct

    def disk_full_detail(self) -> str:
        """Why puts are refused, for the answer to a refused send: the disk's use as ``df`` shows it."""
        c = self.config
        if self.disk_used_pct < 0:
            return "(no room for a new commit log segment)"
        return (f"(disk {self.disk_used_pct:.1f}% used, diskSpaceWarningLevelRatio {c.disk_space_warning_level_ratio}%"
                f"{', no room for a new commit log segment' if self.commit_log.out_of_space else ''})")

    def delete_expired_files(self, now_ms: int | None = None, *, force_oldest: bool = False,
                             only_consumed: bool = False) -> int:
        """Delete commit log segments (never the newest, never undispatched ones) last modified
        more than ``file_reserved_time_hours`` before ``now_ms`` (with ``force_oldest``: the oldest one
        whatever its age; with ``only_consumed``: only those below ``unconsumed_phy_floor``, i.e. every subscribed
        group has consumed them), and in every case none at or above ``retained_phy_floor`` (records the broker
        still needs: pending timer messages); then trim the derived files."""
        if self.queues.expire_pending:
            self.queues.expire_step()
        now = self.clock_ms() if now_ms is None else now_ms
        reserved_ms = self.config.file_reserved_time_hours * _HOUR_MS
        count = 0
        floor: int | None = None
        floor_known = False
        kept_from: int | None = None
        kept_known = False
        held = False
        for mf in self.commit_log.mfq.files[:-1]:
            if mf.end_offset > self.dispatcher.reput_phy_offset:
                break
            if not force_oldest and mf.last_modified_ms() + reserved_ms > now:
                break
            if only_consumed:
                if not floor_known:  # asked once, and only when an expired segment is a candidate
                    floor_known = True
                    provider = self.unconsumed_phy_floor
                    floor = provider() if provider is not None else None
                if floor is not None and mf.end_offset > floor:
                    break
            if not kept_known:  # asked once, and only when a segment is a candidate
                kept_known = True
                keep = self.retained_phy_floor
                kept_from = keep() if keep is not None else None
            if kept_from is not None and mf.end_offset > kept_from:
                held = True
                break
            count += 1
            if force_oldest:
                break
        if kept_known and held != self.retention_held:
            self.retention_held = held
            if held:
                log.warning("commit log segments from phy offset %d on are kept past retention: pending timer "
                            "messages are stored there (they are re-written to the log's end as they age, see "
                            "timerRollWindowSec)", kept_from)
            else:
                log.info("retention no longer held by pending timer messages")
        if count == 0:
            return 0
        self.commit_log.mfq.delete_first(count)
        min_phy = self.commit_log.min_offset
        self.queues.start_expire(min_phy)  # min offsets follow at once; files go in bounded steps
        self.queues.expire_step()
        if self.index is not None:
            self.index.delete_expired(min_phy)
        log.info("deleted %d expired commit log segment(s); min phy offset now %d", count, min_phy)
        return count

    def expire_pending(self) -> bool:
        """Whether consume queue files of deleted commit log segments are still to be deleted (a step runs with
        every ``check_disk_space`` and ``delete_expired_files``)."""
        return self.queues.expire_pending

    def unconsumed_phy_of(self, topic: str, queue_id: int, queue_offset: int) -> int | None:
        """Phy offset of the first message at or after ``queue_offset`` in a consume queue that a group standing
        there has not consumed; None when it has consumed the whole queue (or the queue is unknown here)."""
        cq = self.queues.find(topic, queue_id)
        if cq is None:
            return None
        max_queue_offset = cq.max_offset_in_queue
        if queue_offset >= max_queue_offset:
            return None  # consumed all (known without loading a queue not used since the start)
        newest = cq.unloaded_newest_phy(queue_offset)
        if newest is not None:
            return newest  # all but the newest message consumed: its record is named by the snapshot
        queue_offset = max(queue_offset, cq.min_offset_in_queue)
        if queue_offset >= max_queue_offset:
            return None
        unit = cq.get_unit(queue_offset)
        if unit is None:  # a blank slot: the group has not consumed anything of this queue here
            return self.commit_log.min_offset
        return unit[0]

    def clean_expired_consume_queues(self) -> int:
        """Delete consume-queue and index files whose every entry points below the commit log's first byte
        (CLEAN_EXPIRED_CONSUMEQUEUE); the number of files deleted now. The consume queues are visited in bounded
        steps: this call runs the first, the disk check's timer the rest (``expire_pending``)."""
        min_phy = self.commit_log.min_offset
        if not self.queues.expire_pending:
            self.queues.start_expire(min_phy)
        count = self.queues.expire_step()
        if self.index is not None:
            count += self.index.delete_expired(min_phy)
        return count

    def runtime_info(self) -> dict[str, str]:
        cl = self.commit_log
        try:
            usage = shutil.disk_usage(self.config.store_path_commit_log)
            disk_ratio = f"{usage.used / usage.total:.4f}" if usage.total else "0"
            capacity = f"Total : {human_bytes(usage.total)}, Free : {human_bytes(usage.free)}."
        except OSError:
            disk_ratio = "-1"
            capacity = "Total : 0 B, Free : 0 B."
        try:
            cq_usage = shutil.disk_usage(self.config.store_path_consume_queue)
            cq_ratio = f"{cq_usage.used / cq_usage.total:.4f}" if cq_usage.total else "0"
        except OSError:
            cq_ratio = "-1"
        puts = cl.put_message_times_total
        earliest = self.reader.store_timestamp_at(self.min_phy_offset) if cl.mfq.files else None
        return {
            "bootTimestamp": str(self.boot_timestamp),
            "commitLogMaxOffset": str(self.max_phy_offset),
            "commitLogMinOffset": str(self.min_phy_offset),
            "commitLogFlushedOffset": str(self.flushed_phy_offset),
            "commitLogDiskRatio": disk_ratio,
            "dispatchBehindBytes": str(self.dispatch_behind_bytes),
            "reputPhyOffset": str(self.reput_phy_offset),
            "putMessageTotal": str(cl.put_message_times_total),
            "putMessageTimesTotal": str(cl.put_message_times_total),
            "putMessageSizeTotal": str(cl.put_message_size_total),
            "putMessageAverageSize": f"{cl.put_message_size_total / puts if puts else 0.0:.2f}",
            "consumeQueueDiskRatio": cq_ratio,
            "commitLogDirCapacity": capacity,
            "remainHowManyDataToFlush": human_bytes(max(self.max_phy_offset - self.flushed_phy_offset, 0)),
            "dispatchTotal": str(self.dispatcher.dispatched_total),
            "getMessageTimesTotalFound": str(self.reader.get_found_total),
            "getMessageTimesTotalMiss": str(self.reader.get_miss_total),
            "getMessageTransferedMsgCount": str(self.reader.transferred_msg_total),
            "corruptRecordsNotServed": str(self.reader.corrupt_record_total),
            "consumeQueueCount": str(len(self.queues.queues)),
            # consume queue files mapped now vs maxOpenSegmentFiles (each holds two descriptors); the commit log
            # and index files are mapped besides (docs/store-format.md)
            "storeOpenFiles": str(self.queues.pool.mapped_files),
            "storeOpenFilesLimit": str(self.queues.pool.max_open),
            "storeFileOpenFailures": str(self.queues.pool.open_failures_total),
            "earliestMessageTimeStamp": str(earliest if earliest is not None else -1),
            "lastStartAbnormal": str(self.last_start_was_abnormal).lower(),
        }


#: binary unit prefixes of ``human_bytes`` (as RocketMQ's humanReadableByteCount: 1.5 KiB, 2.0 GiB)
_BYTE_UNITS = "KMGTPE"


def human_bytes(n: int) -> str:
    """``n`` bytes as ``"<value> <unit>"``: ``"512 B"``, ``"1.5 KiB"``, ``"2.0 GiB"``."""
    if n < 1024:
        return f"{n} B"
    value = float(n)
    for prefix in _BYTE_UNITS:
        value /= 1024
        if value < 1024 or prefix == _BYTE_UNITS[-1]:
            return f"{value:.1f} {prefix}iB"
    raise AssertionError("unreachable")
