"""A directory of contiguous fixed-size segments named by their 20-digit start offset.

| file name                     | what                                                               |
|-------------------------------|--------------------------------------------------------------------|
| ``<offset:020d>``             | a segment: ``mapped_file_size`` bytes holding global offsets from ``offset`` |
| ``<offset:020d>.prep``        | the next segment being zero-filled (``warm``, segment_warmer.py); never read as log, deleted at ``load`` |
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Sequence

from ferrymq.store.errors import StoreCorruptError, StoreDirError
from ferrymq.store.mapped_file import MappedFile, OpenFilePool, offset_to_file_name, with_descriptor
from ferrymq.store.segment_warmer import SegmentPrefetcher, SegmentWarmer, remove_stray_prepared

log = logging.getLogger(__name__)


class MappedFileQueue:
    """Segments [files[0] .. files[-1]], contiguous. Only the writer changes ``files``; it replaces the tuple
    rather than editing it, so a flush thread can iterate a snapshot.

    The segments are held as the one ``MappedFile`` itself when there is one (most consume queues of an estate),
    else as a tuple: a queue with one segment adds no container the garbage collector's full passes walk
    (``files`` returns a tuple either way)."""

    __slots__ = ("store_path", "mapped_file_size", "preallocate", "pool", "warm", "_warmer", "_prefetcher",
                 "_files", "flushed_where", "_flush_lock")

    def __init__(self, store_path: str, mapped_file_size: int, *, preallocate: bool = False,
                 warm: bool = False, pool: OpenFilePool | None = None,
                 flush_lock: threading.Lock | None = None) -> None:
        """``flush_lock``: serialises ``flush`` (one per queue by default; the consume queues of a store share one,
        as one thread flushes them in turn)."""
        self.store_path = store_path
        self.mapped_file_size = mapped_file_size
        self.preallocate = preallocate  # new segments get their blocks reserved (MappedFile)
        #: segments are mapped only while in use, at most the pool's limit at once (loaded released)
        self.pool = pool
        #: the next segment is zero-filled ahead of need on a background thread (segment_warmer.py)
        self.warm = warm
        self._warmer: SegmentWarmer | None = None
        #: reads a segment made cold (its zero-fill not done in time) into the page cache ahead of the writer
        self._prefetcher: SegmentPrefetcher | None = None
        self._files: MappedFile | tuple[MappedFile, ...] = ()
        self.flushed_where = 0  # global offset persisted so far
        self._flush_lock = flush_lock if flush_lock is not None else threading.Lock()

    @property
    def files(self) -> tuple[MappedFile, ...]:
        """The segments, oldest first."""
        files = self._files
        return files if isinstance(files, tuple) else (files,)

    @files.setter
    def files(self, files: Sequence[MappedFile]) -> None:
        self._files = files[0] if len(files) == 1 else tuple(files)

    # --- lifecycle ---------------------------------------------------------------------------

    def load(self) -> None:
        """Map every existing segment (positions set to full; recovery trims the last). With ``warm`` and no
        segment yet, start preparing the first one (at offset 0); a queue with segments warms its next one
        from its next roll on, so a restart's recovery does not compete with a zero-fill."""
        if self.warm:
            remove_stray_prepared(self.store_path)
        self._load_files()
        if self.warm and not self.files:
            self._start_warmer(0)

    def _load_files(self) -> None:
        if not os.path.isdir(self.store_path):
            return
        store_path = self.store_path
        listed = with_descriptor(self.pool, "list", store_path, lambda: os.listdir(store_path))
        names = sorted(n for n in listed if len(n) == 20 and n.isdigit())
        files: list[MappedFile] = []
        for n, name in enumerate(names):
            path = os.path.join(self.store_path, name)
            size = os.path.getsize(path)
            if size < self.mapped_file_size and n == len(names) - 1:
                # a crash while creating (or a torn copy of) the newest segment: the missing
                # bytes read as zeros and recovery cuts the data there
                log.warning("%s: short last segment (%d bytes); extending with zeros", path, size)
                os.truncate(path, self.mapped_file_size)
                size = self.mapped_file_size
            if size != self.mapped_file_size:
                for f in files:
                    f.close()
                raise StoreCorruptError(f"{path}: size {size} != configured {self.mapped_file_size}")
            try:
                mf = MappedFile(self.store_path, int(name), self.mapped_file_size, pool=self.pool,
                                open_now=self.pool is None, named_by_offset=True)
            except BaseException:
                for f in files:
                    f.close()
                raise
            mf.wrote_position = mf.flushed_position = self.mapped_file_size
            if files and files[-1].end_offset != mf.file_from_offset:
                for f in [*files, mf]:
                    f.close()
                raise StoreCorruptError(f"gap between segments before {path}")
            if mf.file_from_offset % self.mapped_file_size:
                for f in [*files, mf]:
                    f.close()
                raise StoreCorruptError(f"{path}: start offset not a multiple of the segment size")
            files.append(mf)
        self.files = files
        if files:
            self.flushed_where = files[-1].end_offset

    def close(self) -> None:
        self._stop_background()
        for mf in self.files:
            mf.close()

    def destroy(self) -> None:
        self._stop_background()
        for mf in self.files:
            mf.destroy()
        self.files = ()
        self.flushed_where = 0

    # --- lookup ------------------------------------------------------------------------------

    def first(self) -> MappedFile | None:
        files = self._files
        if isinstance(files, tuple):
            return files[0] if files else None
        return files

    def last(self) -> MappedFile | None:
        files = self._files
        if isinstance(files, tuple):
            return files[-1] if files else None
        return files

    @property
    def min_offset(self) -> int:
        """Start of the first segment, -1 if none."""
        first = self.first()
        return first.file_from_offset if first is not None else -1

    @property
    def max_offset(self) -> int:
        """Global wrote position (next byte to write), 0 if none."""
        last = self.last()
        if last is None:
            return 0
        return last.file_from_offset + last.wrote_position

    def find(self, offset: int) -> MappedFile | None:
        """The segment holding global ``offset`` (O(1): segments are contiguous)."""
        files = self._files
        if not isinstance(files, tuple):
            return files if 0 <= offset - files.file_from_offset < self.mapped_file_size else None
        if not files or offset < 0:
            return None
        index = offset // self.mapped_file_size - files[0].file_from_offset // self.mapped_file_size
        if 0 <= index < len(files):
            return files[index]
        return None

    def segment_start_of(self, offset: int) -> int:
        return offset - offset % self.mapped_file_size

    # --- growth ------------------------------------------------------------------------------

    def create_file(self, file_from_offset: int) -> MappedFile:
        assert file_from_offset % self.mapped_file_size == 0
        last = self.last()
        assert last is None or last.end_offset == file_from_offset, "segments must be contiguous"
        try:
            os.makedirs(self.store_path, exist_ok=True)
        except OSError as exc:
            raise StoreDirError(f"cannot create {self.store_path}: {exc}") from exc
        warmer, self._warmer = self._warmer, None
        self._stop_prefetch()
        cold = False
        if warmer is not None:
            if warmer.file_from_offset == file_from_offset and warmer.ready:
                cold = not warmer.take()  # the zero-filled file is now at ``path`` (False: MappedFile makes it)
            else:
                # a zero-fill still running (the first segment right after a start, a slow disk) is not
                # waited for: that would hold the caller, the broker's event loop, for up to seconds
                warmer.abandon()
                cold = True
        mf = MappedFile(self.store_path, file_from_offset, self.mapped_file_size, preallocate=self.preallocate,
                        pool=self.pool, named_by_offset=True)
        if not self.files:
            self.flushed_where = file_from_offset
        self.files = [*self.files, mf]
        if cold:
            log.info("segment %s made without its zero-fill (not finished in time); its pages are read ahead of "
                     "the writer instead", offset_to_file_name(file_from_offset))
            self._prefetcher = SegmentPrefetcher(mf.path, self.mapped_file_size, lambda: mf.wrote_position)
        if self.warm:
            self._start_warmer(mf.end_offset)
        return mf

    def _start_warmer(self, file_from_offset: int) -> None:
        self._stop_warmer()
        try:
            os.makedirs(self.store_path, exist_ok=True)
        except OSError as exc:
            log.warning("cannot warm the next segment in %s: %s", self.store_path, exc)
            return
        path = os.path.join(self.store_path, offset_to_file_name(file_from_offset))
        if os.path.exists(path):
            return
        self._warmer = SegmentWarmer(path, file_from_offset, self.mapped_file_size)

    def _stop_warmer(self) -> None:
        warmer, self._warmer = self._warmer, None
        if warmer is not None:
            warmer.cancel()

    def _stop_background(self) -> None:
        """The warmer and the prefetcher (close, destroy)."""
        self._stop_warmer()
        self._stop_prefetch()

    def _stop_prefetch(self) -> None:
        prefetcher, self._prefetcher = self._prefetcher, None
        if prefetcher is not None:
            prefetcher.cancel()

    def last_for_write(self, start_offset: int = 0) -> MappedFile:
        """The last segment if it has room, else a new one (the first at ``start_offset``'s segment)."""
        last = self.last()
        if last is None:
            return self.create_file(self.segment_start_of(start_offset))
        if last.is_full():
            return self.create_file(last.end_offset)
        return last

    # --- flush -------------------------------------------------------------------------------

    def flush(self, least_pages: int = 0) -> int:
        """Flush segments from ``flushed_where`` on; returns the new ``flushed_where``."""
        with self._flush_lock:
            for mf in self.files:  # a snapshot: the tuple is replaced, never edited
                if mf.end_offset <= self.flushed_where or mf.closed:
                    continue
                pos = mf.flush(least_pages)
                where = mf.file_from_offset + pos
                if where > self.flushed_where:
                    self.flushed_where = where
                if pos < mf.file_size:
                    break
            return self.flushed_where

    def unflushed(self) -> list[tuple[MappedFile, int]]:
        """The segments ``flush`` would sync now, each with its wrote position taken now: what a file-system-wide
        sync (``syncfs``) started after this call persists; ``note_flushed`` then records it."""
        out: list[tuple[MappedFile, int]] = []
        for mf in self.files:
            if mf.end_offset <= self.flushed_where or mf.closed:
                continue
            wrote = mf.wrote_position
            if wrote > mf.flushed_position:
                out.append((mf, wrote))
            if wrote < mf.file_size:
                break
        return out

    def note_flushed(self, synced: list[tuple[MappedFile, int]]) -> int:
        """Record the positions ``unflushed`` took as persisted (after a sync of the whole file system that
        started after it); returns the new ``flushed_where``."""
        with self._flush_lock:
            for mf, wrote in synced:
                if mf.closed:
                    break
                if wrote > mf.flushed_position:
                    mf.flushed_position = wrote
                where = mf.file_from_offset + wrote
                if where > self.flushed_where:
                    self.flushed_where = where
                if wrote < mf.file_size:
                    break
            return self.flushed_where

    # --- shrink ------------------------------------------------------------------------------

    def truncate(self, offset: int, zero_tail: bool = True) -> None:
        """Drop everything at or after global ``offset``; the segment holding it keeps its head."""
        keep: list[MappedFile] = []
        for mf in self.files:
            if mf.end_offset <= offset:
                keep.append(mf)
            elif mf.file_from_offset <= offset:
                pos = offset - mf.file_from_offset
                mf.wrote_position = mf.flushed_position = pos
                if zero_tail:
                    mf.zero_from(pos)
                keep.append(mf)
            else:
                mf.destroy()
        self.files = keep
        self.flushed_where = min(self.flushed_where, offset)

    def delete_last(self) -> None:
        files = self.files
        if not files:
            return
        self.files = files[:-1]
        files[-1].destroy()
        self.flushed_where = min(self.flushed_where, self.max_offset)

    def delete_first(self, count: int) -> tuple[MappedFile, ...]:
        """Remove and destroy the first ``count`` segments (never the last)."""
        count = min(count, len(self.files) - 1)
        if count <= 0:
            return ()
        gone = self.files[:count]
        self.files = self.files[count:]
        for mf in gone:
            mf.destroy()
        return gone
