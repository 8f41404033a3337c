"""Background JSONL writer. Callers append stored tuples to a bounded deque (an atomic C operation:
no lock, no I/O, no wake-up call); one daemon thread wakes every `interval` seconds, drains the deque,
encodes the lines and appends them to the file in one write per batch, so a killed process leaves at
most one partial last line. When the deque is full the event is dropped and counted, and the count is
written as a record of its own. Files rotate by size (path -> path.1 -> path.2 ...). Any OSError
(unwritable path, full disk) disables the writer with one WARNING; the caller never sees an exception."""
from __future__ import annotations

import atexit
import itertools
import logging
import os
import threading
import time
import weakref
from collections import deque

log = logging.getLogger("hipsched.telemetry")

_live = weakref.WeakSet()


@atexit.register
def _flush_all_at_exit():
    for w in list(_live):
        w.close()


def _disable_in_forked_child():
    """A forked child inherits every writer without its thread, possibly with its I/O lock held (the
    parent's thread was mid-flush) and with the parent's queued events, and it would continue the
    parent's run id and sequence numbers. The parent writes its own events; in the child the inherited
    writers are switched off (in-memory telemetry goes on), so it neither hangs on the lock at exit nor
    writes the parent's events twice."""
    for w in list(_live):
        w._io_lock = threading.Lock()
        w.queue.clear()
        w._closed = True
        w._stop.set()
        w.failed = OSError("forked child: the log writer belongs to the parent process")
        if w._fd is not None:
            try:
                os.close(w._fd)      # the child's copy of the descriptor; the parent's stays open
            except OSError:
                pass
            w._fd = None
    _live.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_disable_in_forked_child)


class JsonlWriter:
    def __init__(self, path, formatter, queue_size=65536, rotate_bytes=64 << 20, keep=8, interval=0.02):
        if queue_size < 1:
            raise ValueError(f"telemetry queue_size must be >= 1, got {queue_size!r}")
        if rotate_bytes is not None and rotate_bytes < 0:
            raise ValueError(f"telemetry rotate_bytes must be >= 0 (0 or None: never rotate), got {rotate_bytes!r}")
        self.path = os.fspath(path)
        self.formatter = formatter
        self.queue_size = int(queue_size)
        self.rotate_bytes = int(rotate_bytes or 0)
        self.keep = max(1, int(keep))
        self.interval = interval
        self.queue = deque()
        self.drop_counter = itertools.count()  # next() on it is atomic under the GIL: exact without a lock
        self._dropped_reported = 0
        self.written = 0                       # lines written (events + service records)
        self.failed = None                     # the error that disabled the writer, if any
        self._fd = None
        self._size = 0
        self._io_lock = threading.Lock()       # serialises drains between the thread and flush()/close()
        self._stop = threading.Event()
        self._closed = False
        try:
            self._open()
        except OSError as e:
            self._fail(e)
        self._thread = threading.Thread(target=self._loop, name="hipsched-telemetry-writer", daemon=True)
        self._thread.start()
        _live.add(self)

    # ---------------------------------------------------------------- hot path
    def put(self, rec) -> None:
        q = self.queue
        if len(q) < self.queue_size:
            q.append(rec)
        else:
            next(self.drop_counter)

    @property
    def dropped(self) -> int:
        # itertools.count's repr is the only way to read it without advancing it.
        return int(repr(self.drop_counter)[6:-1])

    # ---------------------------------------------------------------- thread side
    def _loop(self):
        try:
            while not self._stop.wait(self.interval):
                self.flush()
        except Exception as e:  # a bug here must not leave callers filling a queue nobody drains
            self._fail(OSError(f"writer thread failed: {type(e).__name__}: {e}"))

    def flush(self) -> None:
        """Write everything queued so far (called by the thread, close() and at exit)."""
        with self._io_lock:
            q = self.queue
            n = len(q)
            if n == 0 and self.dropped == self._dropped_reported:
                return
            if self._fd is None:  # disabled: keep the queue from growing, the counters still have it all
                for _ in range(n):
                    q.popleft()
                return
            line = self.formatter.line
            pop = q.popleft
            parts = []
            for _ in range(n):
                rec = pop()
                try:
                    parts.append(line(rec))
                except Exception as e:  # a malformed argument must not kill the writer
                    log.debug("telemetry: event not encodable (%s): %r", e, rec)
            d = self.dropped
            if d != self._dropped_reported:
                parts.append(self.formatter.dropped_line(time.time(), d - self._dropped_reported, d))
                self._dropped_reported = d
            if parts:
                self._write("".join(parts).encode("utf-8"), len(parts))

    def _write(self, data: bytes, nlines: int) -> None:
        try:
            if self.rotate_bytes and self._size and self._size + len(data) > self.rotate_bytes:
                self._rotate()
            view = memoryview(data)
            while view:
                k = os.write(self._fd, view)
                view = view[k:]
            self._size += len(data)
            self.written += nlines
        except OSError as e:
            self._fail(e)

    def _open(self):
        d = os.path.dirname(self.path)
        if d:
            os.makedirs(d, exist_ok=True)
        self._fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        self._size = os.fstat(self._fd).st_size
        # A process killed mid-write (SIGKILL, power loss) leaves a cut last line; appending straight
        # after it would glue our first event onto the fragment and lose it. Every writer writes whole
        # lines in one write, so only such a fragment can lack its newline.
        if self._size and os.pread(self._fd, 1, self._size - 1) != b"\n":
            os.write(self._fd, b"\n")
            self._size += 1

    def _rotate(self):
        os.close(self._fd)
        self._fd = None
        for i in range(self.keep - 1, 0, -1):
            src = f"{self.path}.{i}"
            if os.path.exists(src):
                os.replace(src, f"{self.path}.{i + 1}")
        try:
            os.replace(self.path, f"{self.path}.1")
        except FileNotFoundError:
            pass   # the live log was deleted under us: start a new one rather than give up
        self._open()

    def _close_fd(self) -> None:
        if self._fd is not None:
            try:
                os.close(self._fd)
            except OSError:
                pass
            self._fd = None

    def _fail(self, e: OSError):
        self.failed = e
        self._close_fd()
        log.warning("hipsched telemetry: cannot write %s (%s); the JSONL log is disabled for this run, "
                    "in-memory telemetry continues", self.path, e)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout=10)
        self.flush()
        with self._io_lock:
            self._close_fd()
        _live.discard(self)
