"""Read path: PULL lookups through a consume queue (§2.7 semantics), time search, key query.

Every record served (pull, look-up by offset, key query) is checked first: magic, TOTALSIZE, the physical
offset it was read from and BODYCRC (``verify_stored_record``, the native CRC). A record that fails is never
served: a pull skips it (its queue offset is passed, as for a filtered message), logs an ERROR naming the
phy and queue offsets, counts it in ``corrupt_record_total``; a pull whose scan found only damaged records
answers MESSAGE_CORRUPT (PULL_RETRY_IMMEDIATELY with nextBeginOffset past them). A look-up by offset answers
"not found".

A pull without a filter walks its consume queue units in C (``_speedups.pull_scan``) as long as they are plain
(a BLANK unit, or an IPv4 record wholly in one segment that passes the fast check and fits the answer); any
other unit takes one turn of the Python loop, which is the reference and, without the extension, the whole
path.
"""

from __future__ import annotations

import logging
import struct

from ferrymq.common.message import SYSFLAG_BORNHOST_V6, SYSFLAG_STOREHOST_V6
from ferrymq.common.message_codec import (
    CRC_MASK,
    MESSAGE_MAGIC_CODE,
    VERIFY_V4,
    RecordCheck,
    check_record,
    decode_record_meta,
    store_timestamp_of,
    verify_stored_record,
)
from ferrymq.store.commit_log import CommitLog
from ferrymq.store.config import CQ_STORE_UNIT_SIZE, StoreConfig
from ferrymq.store.consume_queue import BLANK_SIZE, UNIT, ConsumeQueue
from ferrymq.store.dispatch import index_keys_of
from ferrymq.store.filter import MessageFilter
from ferrymq.store.index import IndexService
from ferrymq.store.queue_table import ConsumeQueueTable
from ferrymq.store.results import GetMessageResult, GetMessageStatus, QueryMessageResult
from ferrymq.store.speedups import NATIVE
from ferrymq.store.speedups import crc32 as _crc32

_verify_unpack = VERIFY_V4.unpack_from
_MAGIC = MESSAGE_MAGIC_CODE
_CRC_MASK = CRC_MASK
_HOST_V6 = SYSFLAG_BORNHOST_V6 | SYSFLAG_STOREHOST_V6

log = logging.getLogger(__name__)

_LONG_MIN = -(1 << 63)


class StoreReader:
    def __init__(
        self,
        config: StoreConfig,
        commit_log: CommitLog,
        queues: ConsumeQueueTable,
        index: IndexService | None,
    ) -> None:
        self.config = config
        self.commit_log = commit_log
        self.queues = queues
        self.index = index
        self.get_found_total = 0
        self.get_miss_total = 0
        self.transferred_msg_total = 0
        self.corrupt_record_total = 0
        #: the native loop over plain units of a pull without a filter (None: the Python loop does it all)
        self.native_scan = getattr(NATIVE, "pull_scan", None)

    def _correct(self, old_offset: int, new_offset: int) -> int:
        if not self.config.is_slave or self.config.offset_check_in_slave:
            return new_offset
        return old_offset

    def _batch_full(self, size: int, max_msg_nums: int, total_bytes: int, count: int, in_disk: bool) -> bool:
        if total_bytes == 0 or count == 0:
            return False
        if count >= max_msg_nums:
            return True
        c = self.config
        if in_disk:
            return (
                total_bytes + size > c.max_transfer_bytes_on_message_in_disk
                or count > c.max_transfer_count_on_message_in_disk - 1
            )
        return (
            total_bytes + size > c.max_transfer_bytes_on_message_in_memory
            or count > c.max_transfer_count_on_message_in_memory - 1
        )

    def get_message(
        self, topic: str, queue_id: int, offset: int, max_msg_nums: int, message_filter: MessageFilter | None
    ) -> GetMessageResult:
        cq = self.queues.find(topic, queue_id)
        if cq is None:
            self.get_miss_total += 1
            return GetMessageResult(GetMessageStatus.NO_MESSAGE_IN_QUEUE, self._correct(offset, 0))
        min_offset = cq.min_offset_in_queue
        max_offset = cq.max_offset_in_queue
        result = GetMessageResult(GetMessageStatus.NO_MESSAGE_IN_QUEUE, offset, min_offset, max_offset)
        if max_offset == 0:
            result.next_begin_offset = self._correct(offset, 0)
        elif offset < min_offset:
            result.status = GetMessageStatus.OFFSET_TOO_SMALL
            result.next_begin_offset = self._correct(offset, min_offset)
        elif offset == max_offset:
            result.status = GetMessageStatus.OFFSET_OVERFLOW_ONE
            result.next_begin_offset = self._correct(offset, offset)
        elif offset > max_offset:
            result.status = GetMessageStatus.OFFSET_OVERFLOW_BADLY
            result.next_begin_offset = self._correct(offset, min_offset if min_offset == 0 else max_offset)
        else:
            self._scan(cq, offset, max(1, max_msg_nums), message_filter, result)
        if result.status is GetMessageStatus.FOUND:
            self.get_found_total += 1
            self.transferred_msg_total += result.message_count
        else:
            self.get_miss_total += 1
        return result

    def _scan(
        self, cq: ConsumeQueue, offset: int, max_msg_nums: int, mfilter: MessageFilter | None,
        result: GetMessageResult,
    ) -> None:  # fmt: skip
        units = cq.get_units_buffer(offset, max(16000, max_msg_nums * CQ_STORE_UNIT_SIZE))
        if units is None:
            result.status = GetMessageStatus.OFFSET_FOUND_NULL
            result.next_begin_offset = self._correct(offset, cq.roll_next_file(offset))
            return
        cl = self.commit_log
        max_phy = cl.max_offset
        memory = self.config.memory_for_hot_data_bytes
        status = GetMessageStatus.NO_MATCHED_MESSAGE
        next_file_start = _LONG_MIN
        max_phy_pulling = 0
        buffers = result.buffers
        queue_offsets = result.queue_offsets
        total_bytes = 0
        i = 0
        n = len(units)
        c = self.config
        native = self.native_scan if mfilter is None else None
        while i < n:
            if native is not None and next_file_start == _LONG_MIN:
                # the plain units of one segment in C; the unit it stops at (next segment, answer full,
                # a record that fails the fast check) takes one turn of the loop below
                mf = cl.mfq.find(UNIT.unpack_from(units, i)[0])
                if mf is not None:
                    taken = len(buffers)
                    i_next, total_bytes, last_phy = native(
                        units, i, mf.mm, mf.file_from_offset, mf.wrote_position, cl.data_start_phy_offset,
                        offset, max_msg_nums, c.max_transfer_count_on_message_in_memory,
                        c.max_transfer_bytes_on_message_in_memory, c.max_transfer_count_on_message_in_disk,
                        c.max_transfer_bytes_on_message_in_disk, max_phy, memory, total_bytes, buffers,
                        queue_offsets,
                    )  # fmt: skip
                    if last_phy >= 0:
                        max_phy_pulling = last_phy
                    if len(buffers) > taken:
                        status = GetMessageStatus.FOUND
                    if i_next != i:
                        i = i_next
                        continue
            phy, size, tags = UNIT.unpack_from(units, i)
            i += CQ_STORE_UNIT_SIZE
            if size == BLANK_SIZE:
                continue
            max_phy_pulling = phy
            if next_file_start != _LONG_MIN and phy < next_file_start:
                continue
            if self._batch_full(size, max_msg_nums, total_bytes, len(buffers), max_phy - phy > memory):
                i -= CQ_STORE_UNIT_SIZE
                break
            if mfilter is not None and not mfilter.is_matched_by_consume_queue(tags):
                continue
            record = cl.get_record(phy, size)
            if record is None:
                if total_bytes == 0:
                    status = GetMessageStatus.MESSAGE_WAS_REMOVING
                next_file_start = cl.roll_next_file(phy)
                continue
            # verify_stored_record inlined for the usual IPv4 record (one unpack, the native CRC)
            total, magic, crc, rec_phy, rec_sys_flag, body_len = _verify_unpack(record, 0)
            if ((magic != _MAGIC or total != size or rec_phy != phy or rec_sys_flag & _HOST_V6
                 or not 0 <= body_len <= size - 91 or _crc32(record[88:88 + body_len]) & _CRC_MASK != crc)
                    and not verify_stored_record(record, phy, _crc32)):
                self._report_corrupt(phy, size, cq.topic, cq.queue_id, offset + (i // CQ_STORE_UNIT_SIZE) - 1)
                if total_bytes == 0:
                    status = GetMessageStatus.MESSAGE_CORRUPT
                continue
            if mfilter is not None and not mfilter.is_matched_by_commit_log(record):
                continue
            buffers.append(record)
            queue_offsets.append(offset + (i // CQ_STORE_UNIT_SIZE) - 1)
            total_bytes += size
            status = GetMessageStatus.FOUND
            next_file_start = _LONG_MIN
        result.status = status
        result.message_count = len(buffers)
        result.buffer_total_size = total_bytes
        result.next_begin_offset = offset + i // CQ_STORE_UNIT_SIZE
        result.suggest_pulling_from_slave = max_phy - max_phy_pulling > memory

    def _report_corrupt(self, phy_offset: int, size: int, topic: str, queue_id: int, queue_offset: int) -> None:
        self.corrupt_record_total += 1
        log.error("corrupt record not served: phy offset %d, %d bytes (consume queue %s/%d, queue offset %d)",
                  phy_offset, size, topic, queue_id, queue_offset)

    # --- single records ----------------------------------------------------------------------

    def select_one(self, phy_offset: int) -> bytes | None:
        mf = self.commit_log.mfq.find(phy_offset)
        if mf is None or phy_offset < self.commit_log.min_offset:
            return None
        pos = phy_offset - mf.file_from_offset
        status, size = check_record(mf.mm, pos, False, end=mf.wrote_position)
        if status is not RecordCheck.OK:
            return None
        record = mf.mm[pos : pos + size]
        if not verify_stored_record(record, phy_offset, _crc32):
            self._report_corrupt(phy_offset, size, "-", -1, -1)
            return None
        return record

    def store_timestamp_at(self, phy_offset: int) -> int | None:
        mf = self.commit_log.mfq.find(phy_offset)
        if mf is None or phy_offset < self.commit_log.min_offset:
            return None
        pos = phy_offset - mf.file_from_offset
        if pos + 76 > mf.wrote_position:
            return None
        try:
            return store_timestamp_of(mf.mm, pos)
        except struct.error:
            return None

    def queue_store_timestamp(self, cq: ConsumeQueue, queue_offset: int) -> int | None:
        unit = cq.get_unit(queue_offset)
        if unit is None:
            return None
        return self.store_timestamp_at(unit[0])

    def offset_by_time(self, cq: ConsumeQueue, timestamp_ms: int) -> int:
        """First queue offset whose store time ≥ ``timestamp_ms``; the max offset if none."""
        lo, hi = cq.min_offset_in_queue, cq.max_offset_in_queue
        while lo < hi:
            mid = (lo + hi) // 2
            ts = self.queue_store_timestamp(cq, mid)
            if ts is not None and ts >= timestamp_ms:
                hi = mid
            else:
                lo = mid + 1
        return lo

    # --- key query ---------------------------------------------------------------------------

    def query_message(
        self, topic: str, key: str, max_num: int, begin_ms: int, end_ms: int
    ) -> QueryMessageResult:
        result = QueryMessageResult()
        if self.index is None or max_num <= 0:
            return result
        max_num = min(max_num, self.config.max_msgs_num_batch)
        candidates, last_ts, last_phy = self.index.query(topic, key, max_num * 4 + 16, begin_ms, end_ms)
        result.index_last_update_timestamp = last_ts
        result.index_last_update_phy_offset = last_phy
        seen: set[int] = set()
        for phy in candidates:
            if len(result.buffers) >= max_num:
                break
            if phy in seen:
                continue
            seen.add(phy)
            record = self.select_one(phy)
            if record is None:
                continue
            meta = decode_record_meta(record, 0)
            if meta.topic != topic or not begin_ms <= meta.store_timestamp <= end_ms:
                continue
            if key not in index_keys_of(meta.properties):
                continue
            result.buffers.append(record)
            result.buffer_total_size += len(record)
        return result
