"""The commit log: every record of every topic, appended in order into fixed-size segments.

Hot path (``put_message``): validate, encode with precompiled structs, one memcpy into the
preallocated mmap, bump the per-queue counter, queue a ``RecordMeta`` for dispatch (only without the C
extension: its reput scans the bytes instead). Replicated chunks (``append_at``) go in with ``pwrite``. No fsync
(flushing is ``flush``'s job, on the broker's flush thread) and no consume-queue work (``reput``).
A record never spans segments: when it plus an 8-byte filler does not fit, the rest of the segment
becomes a BLANK filler (§4.8) and the record opens the next segment.
"""

from __future__ import annotations

import logging
import struct
from collections import deque
from collections.abc import Callable
from typing import Any

from ferrymq.common.message import (
    SYSFLAG_BORNHOST_V6,
    SYSFLAG_STOREHOST_V6,
    SYSFLAG_TRANSACTION_MASK,
    SYSFLAG_TRANSACTION_PREPARED,
    SYSFLAG_TRANSACTION_ROLLBACK,
    MessageExtBrokerInner,
)
from ferrymq.common.message_codec import (
    CRC_MASK,
    END_FILE_MIN_BLANK_LENGTH,
    HEAD_V4,
    MESSAGE_MAGIC_CODE,
    RECORD_FIXED_SIZE,
    RecordCheck,
    RecordMeta,
    blank_filler,
    check_record,
    encode_record_parts,
)
from ferrymq.store import speedups
from ferrymq.store.config import BrokerRole, FlushDiskType, StoreConfig
from ferrymq.store.errors import StoreDiskFullError, StoreError, StoreOpenFilesError
from ferrymq.store.mapped_file import MappedFile
from ferrymq.store.mapped_file_queue import MappedFileQueue
from ferrymq.store.results import (
    AppendMessageResult,
    AppendMessageStatus,
    PutMessageResult,
    PutMessageStatus,
)

log = logging.getLogger(__name__)

QueueKey = tuple[str, int]

_NO_CQ = (SYSFLAG_TRANSACTION_PREPARED, SYSFLAG_TRANSACTION_ROLLBACK)
_HOST_V4_MASK = ~(SYSFLAG_BORNHOST_V6 | SYSFLAG_STOREHOST_V6)  # we store IPv4 hosts only
_I16 = struct.Struct(">h")  # PROPERTIESLENGTH
HEAD_V4_SIZE = HEAD_V4.size  # fields 1..15 (body length included)
#: replicated chunks at least this long are written with pwrite(2) (MappedFile.append_written), not the mapping
APPEND_WRITTEN_MIN_BYTES = 16 * 1024


_SLAVE = BrokerRole.SLAVE
#: enum members as module constants (reading one off its class goes through EnumType.__getattr__'s slot)
_PUT_OK = PutMessageStatus.PUT_OK
_APPEND_OK = AppendMessageStatus.PUT_OK
#: builds a result object without its __init__ (the single put sets every field itself)
_new_object = object.__new__


def _illegal(status: PutMessageStatus = PutMessageStatus.MESSAGE_ILLEGAL) -> PutMessageResult:
    return PutMessageResult(status, None)


_VERIFY_END, _VERIFY_BAD, _VERIFY_BLANK, _VERIFY_OTHER = 0, 1, 2, 3


def _verify_records_py(buf: Any, start: int, end: int, base_phy: int) -> tuple[int, int]:
    """The pure-Python ``_speedups.verify_records``: (pos, status) of the first record in buf[start:end] that
    is incomplete (END), fails its check (BAD) or is a BLANK filler."""
    pos = start
    while pos + 8 <= end:
        status, size = check_record(buf, pos, True, end=end, expected_phy_offset=base_phy + pos,
                                    crc32=speedups.crc32)
        if status is RecordCheck.OK:
            pos += size
        elif status is RecordCheck.BLANK:
            return pos, _VERIFY_BLANK
        elif status is RecordCheck.INCOMPLETE:
            return pos, _VERIFY_END
        else:
            return pos, _VERIFY_BAD
    return pos, _VERIFY_END


class CommitLog:
    def __init__(self, config: StoreConfig, clock_ms: Callable[[], int]) -> None:
        self.config = config
        self.clock_ms = clock_ms
        mode = config.commit_log_preallocation
        # warming only pays on an ASYNC_FLUSH master. A slave writes what it copies in large chunks, and its
        # catch-up would write every segment twice (zeros, then data); under SYNC_FLUSH every send's fdatasync
        # would queue behind the zeros' writeback (PROFILE-NOTES "Round 5: flush stalls"). Both reserve blocks.
        warm = (mode == "warm" and config.broker_role is not BrokerRole.SLAVE
                and config.flush_disk_type is not FlushDiskType.SYNC_FLUSH)
        self.mfq = MappedFileQueue(config.store_path_commit_log, config.mapped_file_size_commit_log,
                                   preallocate=mode != "sparse", warm=warm)
        self.file_size = config.mapped_file_size_commit_log
        # next queue offset per (topic, queue_id); rebuilt from the consume queues on load
        self.topic_queue_table: dict[QueueKey, int] = {}
        # records appended by put_* and not yet dispatched (master fast path for reput)
        self.pending: deque[RecordMeta] = deque()
        #: False with the C extension: its reput scans the bytes just written instead (faster than the metas)
        self.queue_metas = speedups.NATIVE is None
        #: the C extension for put_batch_raw (None: put_batch_raw declines, callers use put_messages)
        self.native = speedups.NATIVE
        #: False while the owning store is not running (``MessageStore`` keeps it): ``put_one_raw`` declines
        self.accepting_puts = True
        #: the last segment creation found the disk full (MessageStore.check_disk_space clears it)
        self.out_of_space = False
        #: what a put is answered when the last segment creation failed for another reason than a full disk
        self._segment_failed_status = PutMessageStatus.CREATE_MAPEDFILE_FAILED
        #: replicated bytes (slave) below this physical offset are whole records that passed their check
        self.replica_verified_phy = 0
        # first valid byte when the first segment was started mid-file by append_at (slave)
        self.data_start_phy_offset = 0
        self.last_store_timestamp = 0  # of the newest appended record
        self.put_message_times_total = 0
        self.put_message_size_total = 0
        self._topic_bytes: dict[str, bytes] = {}

    # --- bounds ------------------------------------------------------------------------------

    @property
    def max_offset(self) -> int:
        return self.mfq.max_offset

    @property
    def min_offset(self) -> int:
        first = self.mfq.first()
        if first is None:
            return 0
        return max(first.file_from_offset, self.data_start_phy_offset)

    @property
    def flushed_offset(self) -> int:
        return self.mfq.flushed_where

    def segment_start_of(self, phy_offset: int) -> int:
        return phy_offset - phy_offset % self.file_size

    def roll_next_file(self, phy_offset: int) -> int:
        return phy_offset + self.file_size - phy_offset % self.file_size

    # --- validation --------------------------------------------------------------------------

    def _encode_topic(self, topic: str) -> bytes | None:
        cached = self._topic_bytes.get(topic)
        if cached is not None:
            return cached
        raw = topic.encode("utf-8")
        if not raw or len(raw) > min(127, self.config.max_topic_length):
            return None
        if "/" in topic or "\x00" in topic or topic in (".", ".."):
            return None  # would escape the consume queue directory
        if len(self._topic_bytes) < 100_000:
            self._topic_bytes[topic] = raw
        return raw

    def _check(self, inner: MessageExtBrokerInner) -> tuple[PutMessageStatus | None, bytes, bytes]:
        topic_bytes = self._encode_topic(inner.topic)
        if topic_bytes is None:
            return PutMessageStatus.MESSAGE_ILLEGAL, b"", b""
        props = inner.properties_string.encode("utf-8") if inner.properties_string else b""
        if len(props) > min(32767, self.config.max_properties_size):
            return PutMessageStatus.PROPERTIES_SIZE_EXCEEDED, b"", b""
        if len(inner.body) > self.config.max_message_size:
            return PutMessageStatus.MESSAGE_ILLEGAL, b"", b""
        if len(inner.born_host) != 8 or len(inner.store_host) != 8 or not 0 <= inner.queue_id < 1 << 31:
            return PutMessageStatus.MESSAGE_ILLEGAL, b"", b""
        return None, topic_bytes, props

    # --- write path --------------------------------------------------------------------------

    def _segment_with_room(self, size: int) -> MappedFile | None:
        """The segment the next ``size`` bytes go to, writing a BLANK filler and rolling if needed; None (logged)
        when a segment cannot be created (the put answers CREATE_MAPEDFILE_FAILED)."""
        try:
            mf = self.mfq.last_for_write(0)
            if size + END_FILE_MIN_BLANK_LENGTH > mf.remaining:
                remaining = mf.remaining
                mf.append(blank_filler(remaining))
                mf.wrote_position = mf.file_size
                mf = self.mfq.create_file(mf.end_offset)
        except StoreDiskFullError as exc:
            # no room for the next segment: refuse puts (DISK_FULL) until the store's disk check sees room
            log.error("cannot create commit log segment: %s", exc)
            self.out_of_space = True
            self.accepting_puts = False
            return None
        except (StoreError, OSError) as exc:
            log.error("cannot create commit log segment: %s", exc)
            self._segment_failed_status = (PutMessageStatus.OPEN_FILES_EXHAUSTED if isinstance(exc, StoreOpenFilesError)
                                           else PutMessageStatus.CREATE_MAPEDFILE_FAILED)
            return None
        return mf

    def _no_segment_status(self) -> PutMessageStatus:
        return PutMessageStatus.DISK_FULL if self.out_of_space else self._segment_failed_status

    def put_message(self, inner: MessageExtBrokerInner) -> PutMessageResult:
        status, topic_bytes, props = self._check(inner)
        if status is not None:
            return _illegal(status)
        total = RECORD_FIXED_SIZE + len(inner.body) + len(topic_bytes) + len(props)
        if total + END_FILE_MIN_BLANK_LENGTH > self.file_size:
            return _illegal()
        topic = inner.topic
        queue_id = inner.queue_id
        sys_flag = inner.sys_flag
        key = (topic, queue_id)
        in_cq = (sys_flag & SYSFLAG_TRANSACTION_MASK) not in _NO_CQ
        queue_offset = self.topic_queue_table.get(key, 0) if in_cq else 0
        files = self.mfq.files
        mf = files[-1] if files else None
        if mf is None or total + END_FILE_MIN_BLANK_LENGTH > mf.file_size - mf.wrote_position:
            mf = self._segment_with_room(total)
            if mf is None:
                return _illegal(self._no_segment_status())
        pos = mf.wrote_position
        phy_offset = mf.file_from_offset + pos
        store_ts = self.clock_ms()
        inner.store_timestamp = store_ts
        record = encode_record_parts(inner, topic_bytes, props, queue_offset, phy_offset, store_ts)
        mf.mm[pos : pos + total] = record  # MappedFile.append without the call
        mf.wrote_position = pos + total
        if in_cq:
            self.topic_queue_table[key] = queue_offset + 1
        if self.queue_metas:
            pending = self.pending
            if len(pending) >= self.config.dispatch_pending_max:
                pending.clear()  # reput falls back to parsing the commit log
            pending.append(RecordMeta(phy_offset, total, topic, queue_id, queue_offset, store_ts, sys_flag,
                                      inner.properties_string))
        self.last_store_timestamp = store_ts
        self.put_message_times_total += 1
        self.put_message_size_total += total
        result = AppendMessageResult(
            AppendMessageStatus.PUT_OK, phy_offset, total, store_ts, queue_offset, 1, inner.store_host
        )
        return PutMessageResult(PutMessageStatus.PUT_OK, result)

    def put_messages(self, inners: list[MessageExtBrokerInner]) -> PutMessageResult:
        """A batch for one topic/queue: consecutive queue offsets, records packed straight into the segment
        (``HEAD_V4.pack_into`` per record head, no per-record bytes object), published once."""
        if not inners:
            return _illegal()
        first = inners[0]
        topic = first.topic
        queue_id = first.queue_id
        topic_bytes = self._encode_topic(topic)
        max_props = min(32767, self.config.max_properties_size)
        max_body = self.config.max_message_size
        props_list: list[bytes] = []
        total = 0
        body_total = 0
        fixed = RECORD_FIXED_SIZE + (len(topic_bytes) if topic_bytes is not None else 0)
        for inner in inners:  # the checks of _check(), in its order, per message
            if inner.topic != topic or inner.queue_id != queue_id:
                return _illegal()
            if inner.sys_flag & SYSFLAG_TRANSACTION_MASK:
                return _illegal()  # batches reject transaction flags (§4.9)
            if topic_bytes is None:
                return _illegal()
            text = inner.properties_string
            props = text.encode("utf-8") if text else b""
            if len(props) > max_props:
                return _illegal(PutMessageStatus.PROPERTIES_SIZE_EXCEEDED)
            body_len = len(inner.body)
            if body_len > max_body:
                return _illegal()
            if len(inner.born_host) != 8 or len(inner.store_host) != 8 or not 0 <= queue_id < 1 << 31:
                return _illegal()
            props_list.append(props)
            total += fixed + body_len + len(props)
            body_total += body_len
        if body_total > max_body or total + END_FILE_MIN_BLANK_LENGTH > self.file_size:
            return _illegal()
        assert topic_bytes is not None
        key = (topic, queue_id)
        queue_offset = self.topic_queue_table.get(key, 0)
        mf = self._segment_with_room(total)
        if mf is None:
            return _illegal(self._no_segment_status())
        start_pos = mf.wrote_position
        base = mf.file_from_offset + start_pos
        store_ts = self.clock_ms()
        offsets: list[int] = []
        metas: list[RecordMeta] = []
        queue_metas = self.queue_metas
        topic_head = bytes((len(topic_bytes),)) + topic_bytes
        topic_head_len = len(topic_head)
        pack_head = HEAD_V4.pack_into
        pack_i16 = _I16.pack_into
        crc32 = speedups.crc32
        mm = mf.mm
        pos = start_pos
        phy = base
        qo = queue_offset
        for inner, props in zip(inners, props_list, strict=True):
            inner.store_timestamp = store_ts
            body = inner.body
            body_len = len(body)
            props_len = len(props)
            size = fixed + body_len + props_len
            pack_head(mm, pos, size, MESSAGE_MAGIC_CODE, crc32(body) & CRC_MASK, queue_id, inner.flag, qo, phy,
                      inner.sys_flag & _HOST_V4_MASK, inner.born_timestamp, inner.born_host, store_ts,
                      inner.store_host, inner.reconsume_times, inner.prepared_transaction_offset, body_len)
            p = pos + HEAD_V4_SIZE
            mm[p : p + body_len] = body
            p += body_len
            mm[p : p + topic_head_len] = topic_head
            p += topic_head_len
            pack_i16(mm, p, props_len)
            mm[p + 2 : p + 2 + props_len] = props
            offsets.append(phy)
            if queue_metas:
                metas.append(RecordMeta(phy, size, topic, queue_id, qo, store_ts, inner.sys_flag,
                                        inner.properties_string))
            pos += size
            phy += size
            qo += 1
        mf.wrote_position = pos  # published once, like MappedFile.append of the whole batch
        if queue_metas:
            pending = self.pending
            if len(pending) + len(metas) > self.config.dispatch_pending_max:
                pending.clear()  # reput falls back to parsing the commit log
            if len(metas) <= self.config.dispatch_pending_max:
                pending.extend(metas)
        self.topic_queue_table[key] = qo
        self.last_store_timestamp = store_ts
        self.put_message_times_total += len(offsets)
        self.put_message_size_total += total
        result = AppendMessageResult(
            AppendMessageStatus.PUT_OK, base, total, store_ts, queue_offset, len(offsets),
            first.store_host, tuple(offsets),
        )  # fmt: skip
        return PutMessageResult(PutMessageStatus.PUT_OK, result)

    def put_batch_raw(self, topic: str, queue_id: int, batch_body: bytes, merge_props: bytes, cluster: bytes,
                      sys_flag: int, born_timestamp: int, born_host: bytes, store_host: bytes,
                      reconsume_times: int) -> PutMessageResult | None:
        """SEND_BATCH_MESSAGE straight from the request body: the C extension's ``put_batch`` validates the
        entries, merges each one's properties with ``merge_props`` (the batch header's, WAIT removed, ASCII),
        drops WAIT, sets CLUSTER, and writes the records into the segment (what the send processor's
        ``MessageExtBrokerInner`` list + ``put_messages`` store, byte for byte). None = not handled here
        (no extension, queued metas, malformed or unusual entries, any refusal): the caller takes the
        ``put_messages`` path, which answers exactly as before."""
        native = self.native
        if native is None or self.queue_metas:
            return None
        topic_bytes = self._encode_topic(topic)
        if (topic_bytes is None or not 0 <= queue_id < 1 << 31 or sys_flag & SYSFLAG_TRANSACTION_MASK
                or len(born_host) != 8 or len(store_host) != 8):
            return None
        key = (topic, queue_id)
        queue_offset = self.topic_queue_table.get(key, 0)
        max_props = min(32767, self.config.max_properties_size)
        max_body = self.config.max_message_size
        out = self._put_native(lambda mm, pos, room, base: native.put_batch(
            mm, pos, room, batch_body, topic_bytes, queue_id, queue_offset, base, merge_props, cluster, born_host,
            store_host, born_timestamp, self.clock_ms, sys_flag & _HOST_V4_MASK, reconsume_times, max_props,
            max_body), total_at=1, written_at=2)
        if out is None:
            return None
        failed, (count, total, offsets, msg_ids, store_ts), base = out
        if failed is not None:
            return failed
        self.topic_queue_table[key] = queue_offset + count
        self.last_store_timestamp = store_ts
        self.put_message_times_total += count
        self.put_message_size_total += total
        result = AppendMessageResult(
            AppendMessageStatus.PUT_OK, base, total, store_ts, queue_offset, count, store_host, offsets, msg_ids,
        )  # fmt: skip
        return PutMessageResult(PutMessageStatus.PUT_OK, result)

    def put_one_raw(self, topic: str, queue_id: int, body: bytes, props: bytes, cluster: bytes, flag: int,
                    sys_flag: int, born_timestamp: int, born_host: bytes, store_host: bytes,
                    reconsume_times: int) -> tuple[PutMessageResult, bool] | None:
        """A plain SEND_MESSAGE straight from the request: the C extension's ``put_one`` parses ``props`` (the
        header's properties, ASCII), takes WAIT out, sets CLUSTER and writes the record into the segment (what
        the send processor's ``MessageExtBrokerInner`` + ``put_message`` store, byte for byte). Returns the
        result and the WAIT flag; None = not handled here (no extension, queued metas, DELAY / TRAN_MSG,
        transaction flags, the store not running or a slave, any refusal): the caller takes the ``put_message``
        path, which answers as before.

        Once per plain send, so the usual case (room in the last segment) is written out here: one native call,
        no closure (its cells would be built on every call), enum members read from module constants (an enum
        class attribute goes through ``EnumType.__getattr__``'s slot), ``_put_one_done`` written out; a roll or a
        missing segment goes to ``_put_one_rolling``."""
        native = self.native
        if native is None or self.queue_metas or not self.accepting_puts:
            return None
        config = self.config
        if config.broker_role is _SLAVE:
            return None
        topic_bytes = self._topic_bytes.get(topic) or self._encode_topic(topic)
        if (topic_bytes is None or not 0 <= queue_id < 1 << 31 or sys_flag & SYSFLAG_TRANSACTION_MASK
                or len(born_host) != 8 or len(store_host) != 8):
            return None
        key = (topic, queue_id)
        queue_offset = self.topic_queue_table.get(key, 0)
        max_props = config.max_properties_size
        if max_props > 32767:
            max_props = 32767
        mf = self.mfq.last()
        if mf is not None:
            pos = mf.wrote_position
            file_size = mf.file_size
            if pos < file_size:  # not is_full(): as _put_native's first attempt
                base = mf.file_from_offset + pos
                try:
                    res = native.put_one(mf.mm, pos, file_size - pos - END_FILE_MIN_BLANK_LENGTH, body, props,
                                         topic_bytes, queue_id, queue_offset, base, cluster, born_host, store_host,
                                         born_timestamp, self.clock_ms, flag, sys_flag & _HOST_V4_MASK,
                                         reconsume_times, max_props, config.max_message_size)
                except OverflowError:  # a field out of its record range: the Python path raises as before
                    return None
                if res is None:
                    return None
                total, wait, msg_id, store_ts = res
                if msg_id is None:  # no room: roll (BLANK filler, next segment) and put it there
                    if total + END_FILE_MIN_BLANK_LENGTH > self.file_size:
                        return None  # too large for any segment: MESSAGE_ILLEGAL from the Python path
                    return self._put_one_rolling(topic_bytes, key, queue_offset, max_props, body, props, cluster,
                                                 flag, sys_flag, born_timestamp, born_host, store_host,
                                                 reconsume_times)
                mf.wrote_position = pos + total  # published once, like put_messages
                # _put_one_done written out (one frame less per send)
                self.topic_queue_table[key] = queue_offset + 1
                self.last_store_timestamp = store_ts
                self.put_message_times_total += 1
                self.put_message_size_total += total
                ar = _new_object(AppendMessageResult)
                ar.status = _APPEND_OK
                ar.wrote_offset = base
                ar.wrote_bytes = total
                ar.store_timestamp = store_ts
                ar.queue_offset = queue_offset
                ar.msg_num = 1
                ar.store_host = store_host
                ar.record_offsets = ()
                ar.joined_msg_id = msg_id
                result = _new_object(PutMessageResult)
                result.status = _PUT_OK
                result.append_result = ar
                return result, wait
        return self._put_one_rolling(topic_bytes, key, queue_offset, max_props, body, props, cluster, flag, sys_flag,
                                     born_timestamp, born_host, store_host, reconsume_times)

    def _put_one_rolling(self, topic_bytes: bytes, key: QueueKey, queue_offset: int, max_props: int, body: bytes,
                         props: bytes, cluster: bytes, flag: int, sys_flag: int, born_timestamp: int,
                         born_host: bytes, store_host: bytes, reconsume_times: int
                         ) -> tuple[PutMessageResult, bool] | None:
        """``put_one_raw`` through ``_put_native``: no segment yet, a full one, or no room in the last one."""
        native = self.native
        assert native is not None
        queue_id = key[1]
        max_body = self.config.max_message_size
        out = self._put_native(lambda mm, pos, room, base: native.put_one(
            mm, pos, room, body, props, topic_bytes, queue_id, queue_offset, base, cluster, born_host, store_host,
            born_timestamp, self.clock_ms, flag, sys_flag & _HOST_V4_MASK, reconsume_times, max_props, max_body),
            total_at=0, written_at=2)
        if out is None:
            return None
        failed, (total, wait, msg_id, store_ts), base = out
        if failed is not None:
            return failed, wait
        return self._put_one_done(key, queue_offset, base, total, store_ts, msg_id, store_host), wait

    def _put_one_done(self, key: QueueKey, queue_offset: int, base: int, total: int, store_ts: int, msg_id: str,
                      store_host: bytes) -> PutMessageResult:
        """The bookkeeping of a single put the extension wrote (queue counter, timestamps, totals) and its
        result: AppendMessageResult(PUT_OK, base, total, store_ts, queue_offset, 1, store_host, (), msg_id) in
        PutMessageResult(PUT_OK, ...), built without the two dataclass __init__ frames (every field set here)."""
        self.topic_queue_table[key] = queue_offset + 1
        self.last_store_timestamp = store_ts
        self.put_message_times_total += 1
        self.put_message_size_total += total
        ar = _new_object(AppendMessageResult)
        ar.status = _APPEND_OK
        ar.wrote_offset = base
        ar.wrote_bytes = total
        ar.store_timestamp = store_ts
        ar.queue_offset = queue_offset
        ar.msg_num = 1
        ar.store_host = store_host
        ar.record_offsets = ()
        ar.joined_msg_id = msg_id
        result = _new_object(PutMessageResult)
        result.status = _PUT_OK
        result.append_result = ar
        return result

    def _put_native(self, put: Callable[[Any, int, int, int], tuple[Any, ...] | None], total_at: int,
                    written_at: int) -> tuple[PutMessageResult | None, tuple[Any, ...], int] | None:
        """Run a native put ``put(mm, pos, room, phy_offset)`` at the end of the last segment. When the
        record(s) do not fit (the answer's ``written_at`` item is None, ``total_at`` holds the size), roll to a
        new segment (BLANK filler, as put_message does) and run it once more. Returns (None, answer, phy
        offset) with the segment's write position advanced, or (CREATE_MAPEDFILE_FAILED result, the sizing
        answer, 0) when the segment cannot be created; None when the extension declines (too large for any
        segment included): the Python path answers, as before."""
        files = self.mfq.files
        mf = files[-1] if files else None
        for attempt in range(2):
            if mf is None or mf.is_full():
                pos, room, base = 0, -1, 0  # validate and size only
            else:
                pos = mf.wrote_position
                room = mf.file_size - pos - END_FILE_MIN_BLANK_LENGTH
                base = mf.file_from_offset + pos
            try:
                res = put(mf.mm if mf is not None else b"", pos, room, base)
            except OverflowError:  # a field out of its record range: the Python path raises as before
                return None
            if res is None:
                return None
            total = res[total_at]
            if res[written_at] is not None:
                assert mf is not None
                mf.wrote_position = pos + total  # published once, like put_messages
                return None, res, base
            if attempt or total + END_FILE_MIN_BLANK_LENGTH > self.file_size:
                return None  # too large for any segment: MESSAGE_ILLEGAL from the Python path
            mf = self._segment_with_room(total)
            if mf is None:
                return _illegal(self._no_segment_status()), res, 0
        return None  # pragma: no cover - the second call always has room

    def _queue_dispatch(self, meta: RecordMeta) -> None:
        if not self.queue_metas:
            return
        pending = self.pending
        if len(pending) >= self.config.dispatch_pending_max:
            pending.clear()  # reput falls back to parsing the commit log
        pending.append(meta)

    # --- read path ---------------------------------------------------------------------------

    def get_record(self, phy_offset: int, size: int) -> bytes | None:
        """The raw ``size`` bytes at ``phy_offset`` if present and fully written."""
        mf = self.mfq.find(phy_offset)
        if mf is None or phy_offset < self.data_start_phy_offset:
            return None
        return mf.read(phy_offset - mf.file_from_offset, size)

    def read_from(self, phy_offset: int, max_bytes: int) -> bytes:
        """Raw bytes from ``phy_offset`` up to the wrote position, within one segment."""
        if max_bytes <= 0 or phy_offset < self.min_offset:
            return b""
        mf = self.mfq.find(phy_offset)
        if mf is None:
            return b""
        pos = phy_offset - mf.file_from_offset
        end = min(mf.wrote_position, pos + max_bytes)
        if end <= pos:
            return b""
        return mf.mm[pos:end]

    # --- replication (slave) -----------------------------------------------------------------

    def append_at(self, phy_offset: int, data: bytes) -> bool:
        """Append raw bytes exactly at ``phy_offset`` (== max offset, or anywhere if empty)."""
        if phy_offset < 0:
            return False
        if self.mfq.last() is None:
            if not data:
                return True
            mf = self.mfq.create_file(self.segment_start_of(phy_offset))
            mf.wrote_position = mf.flushed_position = phy_offset - mf.file_from_offset
            self.mfq.flushed_where = phy_offset
            self.data_start_phy_offset = phy_offset if mf.wrote_position else 0
        elif phy_offset != self.max_offset:
            return False
        view = memoryview(data)
        try:
            while view:
                mf = self.mfq.last_for_write(phy_offset)
                n = min(mf.remaining, len(view))
                if n >= APPEND_WRITTEN_MIN_BYTES:
                    mf.append_written(view[:n])
                else:
                    mf.append(view[:n].tobytes() if n < len(view) else bytes(view))
                view = view[n:]
        finally:
            view.release()
        return self._verify_replicated()

    def _verify_replicated(self) -> bool:
        """Check every record replication completed (magic, size, physical offset, BODYCRC) before anything
        reads or dispatches it. A record that fails is cut off with everything after it (the slave reconnects
        and asks for it again) and False is returned: a slave never keeps a damaged record."""
        native = self.native
        r = self.replica_verified_phy
        max_phy = self.max_offset
        if r < self.min_offset:
            r = self.min_offset
        while r < max_phy:
            mf = self.mfq.find(r)
            if mf is None:
                break
            base = mf.file_from_offset
            end = mf.wrote_position
            if native is not None:
                pos, status = native.verify_records(mf.mm, r - base, end, base)
            else:
                pos, status = _verify_records_py(mf.mm, r - base, end, base)
            r = base + pos
            if status == _VERIFY_END:
                break
            if status == _VERIFY_BLANK:
                r = mf.end_offset
                continue
            if status == _VERIFY_OTHER:
                check, size = check_record(mf.mm, pos, True, end=end, expected_phy_offset=r, crc32=speedups.crc32)
                if check is RecordCheck.OK:
                    r += size
                    continue
                if check is RecordCheck.INCOMPLETE:
                    break
            log.error("replication: the record at phy offset %d fails its check; cut from there, asking the "
                      "master again", r)
            self.replica_verified_phy = r
            self.mfq.truncate(r)
            return False
        self.replica_verified_phy = r
        return True

    # --- recovery ----------------------------------------------------------------------------

    def truncate(self, phy_offset: int) -> None:
        self.replica_verified_phy = phy_offset
        self.mfq.truncate(phy_offset)
        self.pending.clear()
        if self.data_start_phy_offset and self.mfq.last() is None:
            self.data_start_phy_offset = 0

    def flush(self, least_pages: int = 0) -> int:
        return self.mfq.flush(least_pages)
