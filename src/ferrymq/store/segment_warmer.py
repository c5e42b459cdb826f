"""Zero-filled ("warmed") commit log segments, prepared one segment ahead on a background thread.

Why: on ext4 a segment whose blocks are reserved but unwritten (``posix_fallocate``) or not allocated
(sparse) needs metadata changes when its pages are first written back, so every periodic ``fdatasync``
commits the journal; the writer's next page faults (they update the file's mtime) wait for that commit.
Measured with ``ferry bench --only 1``: p999 of a send ~8.5 ms with fallocated segments, ~2.3 ms with
zero-filled ones (benchmarks/PROFILE-NOTES.md, "Round 5: flush stalls"). Writing the zeros takes ~0.2 s per
GiB, so it is done ahead of need, like RocketMQ's pre-allocated, warmed mapped files.

A prepared segment is written under ``<name>.prep`` and renamed to its 20-digit name only when the queue
takes it, so a crash never leaves a zero-filled segment that looks like part of the log (``load`` deletes
stray ``.prep`` files).

A segment needed before its zero-fill ended (the first one right after a start, or a writer faster than the
zero-fill) is made cold instead (``MappedFileQueue.create_file``: the event loop does not wait for a zero-fill).
The writer's first touch of each page of a cold segment faults, and the kernel then zero-fills the whole
read-ahead window around it in the page cache, on the event loop thread: with the device's 8 MiB window that
was 16 % of a broker's samples under 256 KiB batches, and ~15 % of their throughput. ``SegmentPrefetcher``
does that reading on a thread instead, ahead of the writer (``posix_fadvise(POSIX_FADV_WILLNEED)``, in
``PREFETCH_CHUNK_BYTES`` steps, at most ``PREFETCH_AHEAD_BYTES`` ahead): reading changes no byte of the
file, so it needs no coordination with the writer, and a page the writer dirtied first is left as it is.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable

from ferrymq.store.mapped_file import pwrite_all

log = logging.getLogger(__name__)

#: zeros written per ``pwrite`` (the thread takes the GIL once per chunk)
ZERO_FILL_CHUNK_BYTES = 8 << 20
PREPARED_SUFFIX = ".prep"
#: a cold segment is read into the page cache this many bytes per ``posix_fadvise`` call (the GIL is released
#: for each; the kernel reads at most its read-ahead maximum per call anyway)
PREFETCH_CHUNK_BYTES = 8 << 20
#: the prefetch stays at most this far ahead of the writer (an idle broker does not read its whole segment in)
PREFETCH_AHEAD_BYTES = 64 << 20
#: how often a prefetch that is far enough ahead looks at the writer's position again
PREFETCH_POLL_S = 0.05


class SegmentWarmer:
    """Writes one zero-filled segment file of ``file_size`` bytes for global offset ``file_from_offset``."""

    def __init__(self, final_path: str, file_from_offset: int, file_size: int) -> None:
        self.final_path = final_path
        self.tmp_path = final_path + PREPARED_SUFFIX
        self.file_from_offset = file_from_offset
        self.file_size = file_size
        self.error: OSError | None = None
        self._cancelled = threading.Event()
        #: ``abandon`` and the thread's end decide under this lock which of the two removes the file
        self._end_lock = threading.Lock()
        self._abandoned = False
        self._ended = False
        self._thread = threading.Thread(target=self._run, name="ferrymq-segment-warmer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            fd = os.open(self.tmp_path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        except OSError as exc:
            self.error = exc
            return
        try:
            zeros = memoryview(bytes(min(ZERO_FILL_CHUNK_BYTES, self.file_size)))
            for pos in range(0, self.file_size, len(zeros)):
                if self._cancelled.is_set():
                    break
                pwrite_all(fd, zeros[: self.file_size - pos], pos, self.tmp_path)
        except OSError as exc:
            self.error = exc
        finally:
            os.close(fd)
        with self._end_lock:
            self._ended = True
            abandoned = self._abandoned
        if abandoned:
            self._remove()  # nobody waits for this thread: it cleans up after itself

    @property
    def ready(self) -> bool:
        """The zero-fill has ended (done or failed): ``take`` returns without waiting."""
        return not self._thread.is_alive()

    def abandon(self) -> None:
        """Stop without waiting: the thread ends after its current chunk and removes the file itself. For the
        event loop, which must not wait for a zero-fill (see ``MappedFileQueue.create_file``)."""
        self._cancelled.set()
        with self._end_lock:
            self._abandoned = True
            ended = self._ended
        if ended:
            self._remove()

    def take(self) -> bool:
        """Wait for the file and move it to its segment name. False (file removed): not usable, the caller
        creates the segment itself."""
        self._thread.join()
        if self.error is not None or self._cancelled.is_set():
            if self.error is not None:
                log.warning("warming segment %s failed: %s", self.final_path, self.error)
            self._remove()
            return False
        try:
            os.rename(self.tmp_path, self.final_path)
        except OSError as exc:
            log.warning("cannot move warmed segment into place %s: %s", self.final_path, exc)
            self._remove()
            return False
        return True

    def cancel(self) -> None:
        """Stop, wait for the thread, and remove the file."""
        self._cancelled.set()
        self._thread.join()
        self._remove()

    def _remove(self) -> None:
        try:
            os.unlink(self.tmp_path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.warning("cannot remove %s: %s", self.tmp_path, exc)


class SegmentPrefetcher:
    """Reads a cold segment of ``file_size`` bytes at ``path`` into the page cache on a daemon thread, from the
    writer's position (``position()``, bytes into the segment) on, at most ``PREFETCH_AHEAD_BYTES`` ahead of it,
    until the segment's end; ``cancel`` stops it after its current chunk without waiting."""

    def __init__(self, path: str, file_size: int, position: Callable[[], int]) -> None:
        self.path = path
        self.file_size = file_size
        self._position = position
        self._cancelled = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ferrymq-segment-prefetch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        advise = getattr(os, "posix_fadvise", None)
        if advise is None:
            return
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:  # advice only: the writer faults its pages in as before
            log.debug("cannot prefetch %s: %s", self.path, exc)
            return
        chunk = PREFETCH_CHUNK_BYTES
        try:
            pos = 0
            while pos < self.file_size and not self._cancelled.is_set():
                writer = self._position()
                if pos >= writer + PREFETCH_AHEAD_BYTES:
                    self._cancelled.wait(PREFETCH_POLL_S)
                    continue
                pos = max(pos, writer // chunk * chunk)
                advise(fd, pos, min(chunk, self.file_size - pos), os.POSIX_FADV_WILLNEED)
                pos += chunk
        except OSError as exc:
            log.debug("prefetching %s stopped: %s", self.path, exc)
        finally:
            os.close(fd)

    @property
    def done(self) -> bool:
        return not self._thread.is_alive()

    def cancel(self) -> None:
        self._cancelled.set()

    def join(self, timeout_s: float | None = None) -> None:
        self._thread.join(timeout_s)


def remove_stray_prepared(directory: str) -> None:
    """Delete ``*.prep`` files left by a crash while a segment was being warmed."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return
    for name in names:
        if name.endswith(PREPARED_SUFFIX):
            try:
                os.unlink(os.path.join(directory, name))
            except OSError as exc:
                log.warning("cannot remove stray %s: %s", name, exc)
