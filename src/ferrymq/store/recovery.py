"""Start-up recovery (§5.4): find the valid end of the commit log, cut the torn tail, make the
consume queues agree with it, and choose where re-dispatch starts.

* Normal start (no ``abort`` file): CRC-walk the last ``recover_segments_normal`` segments.
* Abnormal start (``abort`` present: the last run crashed): CRC-walk from the checkpoint's
  ``dispatched_phy_offset`` itself (everything below it was flushed in the commit log, the consume
  queues and the index) when a record boundary is found there; otherwise from the segment holding
  it (at most ``recover_segments_normal`` back), or from the first segment if that is unknown. The
  checkpoint is trusted only while the record each consume queue ends with is intact: a tail lost on disk
  below the checkpoint makes recovery walk the segment instead. Checked only for the queues whose newest unit lies
  in that segment (older damage is beyond what the walk would repair) and read from the commit log at the record
  the queue's ``queueoffsets`` line names: no consume queue file is opened for it.

Consume queues the ``queueoffsets`` snapshot accounts for are not opened at start (``ConsumeQueue``: loaded on
first use). Only those whose newest unit reaches past the recovered end are loaded here, to be cut; units any other
queue holds past it (written after its last flush, before a crash) are dropped when it is loaded
(``LogFloor.valid_end``).

The walk stops at the first record with a bad magic, size or physical offset, or at zeros, and at a bad
CRC on the last record (a torn write). A record whose only fault is its BODYCRC and that an intact record
follows is bit rot, not a torn tail: it is kept (the read path never serves it) with the records after it.
Everything from there on is zeroed (rest of that segment) or deleted (later segments). Consume
queue units pointing past the cut are dropped; units the queues lack are re-dispatched by reput.

Whatever the checkpoint says, a consume queue shorter than the ``queueoffsets`` snapshot records (a file
deleted or cut by hand, or lost) is rebuilt from the commit log (``rebuild_short_queues``): the walk starts
at the end of what the shortest such queue still holds and writes units for those queues only, up to where
reput then takes over. Without such a queue nothing is walked (detection is one dictionary look-up per queue).

Likewise an index file the ``indexfiles`` manifest lists but that is missing or cut (another size) is rebuilt
(``rebuild_missing_index``) from the stretch of the log it covered: from its begin phy offset to the next file's
(the newest: to where reput takes over). Detection is one look-up per index file; only those stretches are
walked.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from ferrymq.common.message import (
    SYSFLAG_TRANSACTION_MASK,
    SYSFLAG_TRANSACTION_PREPARED,
    SYSFLAG_TRANSACTION_ROLLBACK,
)
from ferrymq.common.message_codec import RecordCheck, check_record, check_record_meta
from ferrymq.store.checkpoint import StoreCheckpoint
from ferrymq.store.commit_log import CommitLog
from ferrymq.store.config import StoreConfig
from ferrymq.store.dispatch import index_keys_of
from ferrymq.store.index import IndexService
from ferrymq.store.mapped_file import MappedFile
from ferrymq.store.mapped_file_queue import MappedFileQueue
from ferrymq.store.queue_table import ConsumeQueueTable
from ferrymq.store.speedups import crc32 as _crc32

log = logging.getLogger(__name__)

_NO_CQ = (SYSFLAG_TRANSACTION_PREPARED, SYSFLAG_TRANSACTION_ROLLBACK)


def walk_valid_end(mfq: MappedFileQueue, start_index: int, start_pos: int, check_crc: bool) -> int:
    """Global offset just past the last valid record, walking from files[start_index] + start_pos."""
    files = mfq.files
    i = start_index
    mf = files[i]
    pos = start_pos
    while True:
        status, size = check_record(
            mf.mm, pos, check_crc, end=mf.file_size, expected_phy_offset=mf.file_from_offset + pos, crc32=_crc32
        )
        if status is RecordCheck.OK:
            pos += size
            continue
        if status is RecordCheck.CORRUPT and check_crc:
            rotten = _rotten_size(mf, pos)
            if rotten:
                # a damaged body inside the log, not a torn tail: keep the record (the read path never serves
                # it) and every acknowledged record after it
                log.error("commit log: BODYCRC mismatch at phy offset %d, %d bytes; the record is kept but never "
                          "served", mf.file_from_offset + pos, rotten)
                pos += rotten
                continue
        if status is RecordCheck.BLANK and size == mf.file_size - pos:
            if i + 1 < len(files):
                i += 1
                mf = files[i]
                pos = 0
                continue
            return mf.end_offset
        if status is not RecordCheck.END:
            log.warning(
                "commit log: invalid record (%s) at phy offset %d", status.value, mf.file_from_offset + pos
            )
        return mf.file_from_offset + pos


def _rotten_size(mf: MappedFile, pos: int) -> int:
    """TOTALSIZE of the record at ``pos`` when only its BODYCRC is wrong (its framing is intact) AND an intact
    record follows it in the same segment; 0 otherwise. A bad CRC on the last record of the log is a torn
    write (its body never fully reached the disk) and is cut like any torn tail."""
    expected = mf.file_from_offset + pos
    status, size = check_record(mf.mm, pos, False, end=mf.file_size, expected_phy_offset=expected)
    if status is not RecordCheck.OK:
        return 0
    nxt, _ = check_record(mf.mm, pos + size, True, end=mf.file_size, expected_phy_offset=expected + size,
                          crc32=_crc32)
    return size if nxt is RecordCheck.OK else 0


def _checkpoint_resume(mfq: MappedFileQueue, dispatched: int, min_phy: int) -> tuple[int, int] | None:
    """(segment index, position) to start the walk at the checkpoint's dispatched offset, or None.

    The checkpoint's ``dispatched_phy_offset`` is min(reput offset, flushed offset) at its last write:
    a record boundary below which the commit log was flushed and already CRC-checked by the run that
    wrote it. It is used only if it lies inside the log and a record (or a segment end / filler /
    zeros) starts exactly there; otherwise recovery walks whole segments as before.
    """
    if dispatched <= min_phy:
        return None
    holder = mfq.find(dispatched)
    if holder is None:
        return None
    pos = dispatched - holder.file_from_offset
    if pos == 0 or pos >= holder.file_size:
        return None
    status, _size = check_record(holder.mm, pos, True, end=holder.file_size, expected_phy_offset=dispatched,
                                  crc32=_crc32)
    if status is RecordCheck.CORRUPT or status is RecordCheck.INCOMPLETE:
        return None
    # the segment must still hold its data below the checkpoint (not lost or zeroed since)
    first_pos = max(0, min_phy - holder.file_from_offset)
    first_status, _ = check_record(holder.mm, first_pos, True, end=holder.file_size,
                                   expected_phy_offset=holder.file_from_offset + first_pos)
    if first_status is not RecordCheck.OK:
        return None
    return mfq.files.index(holder), pos


def _queue_tails_intact(mfq: MappedFileQueue, queues: ConsumeQueueTable, from_phy: int, below_phy: int) -> bool:
    """Whether the record each consume queue ends with is still intact in the log, for the queues whose newest unit
    lies in [``from_phy``, ``below_phy``): the stretch a walk that does not trust the checkpoint would cover.

    The checkpoint says the log was flushed up to its dispatched offset, but the disk may have lost the
    tail anyway (a torn write, a damaged file): then the newest units of some queue point into zeros or
    garbage, and recovery must not resume at the checkpoint. The newest unit of a queue not loaded yet is the one
    its ``queueoffsets`` line names: the check reads the commit log only, never a consume queue file, and a queue
    whose newest unit is older than ``from_phy`` costs one comparison (damage there is left to the read path,
    which never serves a damaged record, as a walk from ``from_phy`` would leave it too)."""
    for cq in list(queues.queues.values()):
        phy, size = cq.last_unit
        if phy < from_phy or size <= 0 or phy + size > below_phy:
            continue
        holder = mfq.find(phy)
        if holder is None:
            continue
        status, found = check_record(holder.mm, phy - holder.file_from_offset, True, end=holder.file_size,
                                     expected_phy_offset=phy, crc32=_crc32)
        if status is not RecordCheck.OK or found != size:
            log.warning("commit log: the record of consume queue %s/%d at phy offset %d is damaged; "
                        "recovery walks the log instead of trusting the checkpoint", cq.topic, cq.queue_id, phy)
            return False
    return True


def _fallback_start(config: StoreConfig, mfq: MappedFileQueue, dispatched: int) -> int:
    """Index of the segment an abnormal start walks from when it does not trust the checkpoint."""
    files = mfq.files
    holder = mfq.find(dispatched) if dispatched > 0 else None
    start_index = files.index(holder) if holder is not None else 0
    return min(start_index, max(0, len(files) - config.recover_segments_normal))


def recover(
    config: StoreConfig,
    commit_log: CommitLog,
    queues: ConsumeQueueTable,
    checkpoint: StoreCheckpoint,
    abnormal: bool,
) -> int:
    """Repair files in place; returns the phy offset re-dispatch must start from."""
    mfq = commit_log.mfq
    files = mfq.files
    first = mfq.first()
    data_start = checkpoint.data_start_phy_offset
    if first is None or not first.file_from_offset < data_start < first.end_offset:
        data_start = 0
    commit_log.data_start_phy_offset = data_start
    if first is None:
        queues.truncate_dirty(0)
        commit_log.topic_queue_table = {}
        return 0

    dispatched = checkpoint.dispatched_phy_offset
    resume = _checkpoint_resume(mfq, dispatched, max(first.file_from_offset, data_start)) if abnormal else None
    fallback_index = _fallback_start(config, mfq, dispatched)
    if resume is not None and not _queue_tails_intact(mfq, queues, files[fallback_index].file_from_offset,
                                                      dispatched):
        resume = None
    if resume is not None:
        # crash: everything below the checkpoint was flushed and dispatched; walk only what came after
        # it (a clean start still CRC-walks its last segments, as before)
        start_index, start_pos = resume
    elif abnormal:
        start_index = fallback_index
        start_pos = data_start - first.file_from_offset if start_index == 0 and data_start else 0
    else:
        start_index = max(0, len(files) - config.recover_segments_normal)
        start_pos = data_start - first.file_from_offset if start_index == 0 and data_start else 0

    valid_end = walk_valid_end(mfq, start_index, start_pos, config.check_crc_on_recover)
    log.info("commit log: valid data ends at phy offset %d", valid_end)
    commit_log.truncate(valid_end)
    commit_log.last_store_timestamp = checkpoint.physic_msg_timestamp

    queues.truncate_dirty(valid_end)
    min_phy = commit_log.min_offset
    queues.correct_min_offsets(min_phy)
    commit_log.topic_queue_table = {
        key: cq.max_offset_in_queue for key, cq in queues.queues.items() if cq.max_offset_in_queue > 0
    }

    if dispatched > 0:
        reput_from = dispatched
    elif not abnormal:
        reput_from = queues.max_phy_end()
    else:
        reput_from = min_phy
    return max(min_phy, min(reput_from, valid_end))


def short_queues(queues: ConsumeQueueTable, expected: dict[tuple[str, int], int]) -> dict[tuple[str, int], int]:
    """Queues holding fewer units than ``expected`` (the ``queueoffsets`` snapshot) says they reached: key -> the
    queue offset they hold up to now (0 for a missing queue)."""
    out: dict[tuple[str, int], int] = {}
    for key, next_offset in expected.items():
        cq = queues.find(*key)
        have = cq.max_offset_in_queue if cq is not None else 0
        if have < next_offset:
            out[key] = have
    return out


def rebuild_short_queues(
    commit_log: CommitLog,
    queues: ConsumeQueueTable,
    expected: dict[tuple[str, int], int],
    until_phy: int,
    tags_code: Callable[[str, str, int], int],
) -> int:
    """Rewrite the units consume queues lack (``short_queues``) from the commit log records below ``until_phy``
    (reput dispatches the rest); returns the units written. Only those queues are written; the walk starts at
    the lowest phy offset any of them still covers (the log start for a missing queue)."""
    short = short_queues(queues, expected)
    if not short:
        return 0
    min_phy = commit_log.min_offset
    start = until_phy
    for key, have in short.items():
        cq = queues.find(*key)
        start = min(start, cq.max_phy_end if cq is not None and have > 0 else min_phy)
    start = max(start, min_phy)
    log.warning("consume queues shorter than they were (deleted or cut on disk): %s; rebuilding them from the "
                "commit log [%d, %d)", ", ".join(f"{t}/{q} ({have} of {expected[(t, q)]} units)"
                                                    for (t, q), have in sorted(short.items())[:10])
                + (f" and {len(short) - 10} more" if len(short) > 10 else ""), start, until_phy)
    written = 0
    mfq = commit_log.mfq
    phy = start
    while phy < until_phy:
        mf = mfq.find(phy)
        if mf is None:
            break
        status, size, meta = check_record_meta(mf.mm, phy - mf.file_from_offset, mf.wrote_position)
        if meta is None:
            if status is RecordCheck.BLANK:
                phy = mf.end_offset
                continue
            break  # the end of the valid log (recovery cut there) or a record reput reports
        key = (meta.topic, meta.queue_id)
        if key in short and (meta.sys_flag & SYSFLAG_TRANSACTION_MASK) not in _NO_CQ:
            cq = queues.get_or_create(*key)
            if meta.queue_offset >= cq.max_offset_in_queue and cq.put_unit(
                    phy, size, tags_code(meta.topic, meta.properties, meta.store_timestamp), meta.queue_offset):
                queues.mark_dirty(cq)
                written += 1
        phy += size
    table = commit_log.topic_queue_table
    for key in short:
        cq = queues.find(*key)
        if cq is not None and table.get(key, 0) < cq.max_offset_in_queue:
            table[key] = cq.max_offset_in_queue
    log.warning("consume queue rebuild: %d units written", written)
    return written


def rebuild_missing_index(
    commit_log: CommitLog,
    index: IndexService,
    manifest: list[tuple[str, int]] | None,
    until_phy: int,
) -> int:
    """Rebuild the index files ``manifest`` lists that are missing or cut (``IndexService.missing``) from the
    commit log records they covered (below ``until_phy``; reput indexes the rest); returns the entries written.
    Nothing is walked without such a file, or without a manifest."""
    if not manifest:
        return 0
    missing = index.missing(manifest, until_phy)
    if not missing:
        return 0
    min_phy = commit_log.min_offset
    written = 0
    for name, first_phy, last_phy, last_included in missing:
        start = max(first_phy, min_phy)
        stop = min(last_phy, until_phy)
        if start > stop or start >= until_phy:
            continue
        items = _index_items(commit_log, start, stop, last_included and stop < until_phy)
        done = index.install_rebuilt(name, items, newest=not last_included)
        written += done
        log.warning("index file %s was missing or cut: rebuilt %d entries from the commit log [%d, %d%s", name,
                    done, start, stop, "]" if last_included else ")")
    return written


def _index_items(commit_log: CommitLog, start: int, stop: int, stop_included: bool
                 ) -> list[tuple[str, str, int, int]]:
    """(topic, key, phy_offset, store_timestamp) of the index entries dispatch made for the records in
    [start, stop) (and the one at ``stop`` if ``stop_included``), in log order."""
    items: list[tuple[str, str, int, int]] = []
    mfq = commit_log.mfq
    phy = start
    while phy < stop or (stop_included and phy == stop):
        mf = mfq.find(phy)
        if mf is None:
            break
        status, size, meta = check_record_meta(mf.mm, phy - mf.file_from_offset, mf.wrote_position)
        if meta is None:
            if status is RecordCheck.BLANK:
                phy = mf.end_offset
                continue
            break
        if (meta.sys_flag & SYSFLAG_TRANSACTION_MASK) != SYSFLAG_TRANSACTION_ROLLBACK and meta.properties:
            items.extend((meta.topic, key, phy, meta.store_timestamp) for key in index_keys_of(meta.properties))
        phy += size
    return items
