"""Following a JSONL log the way `tail -F` does: start from the last N lines, then wait for more; a cut
last line waits in a buffer until its newline arrives; rotation (the path now names a new file) and
truncation are noticed and reading continues from the new file's start. Malformed lines are skipped
and counted in the ReadStats."""
from __future__ import annotations

import os
import time

from .reader import ReadStats, parse_line


def _start_of_last_lines(fd, n, block=65536) -> int:
    """Offset where the last n complete lines start (reads backwards, so a 1 GB log costs little)."""
    end = os.lseek(fd, 0, os.SEEK_END)
    if n <= 0:
        return end
    pos, found = end, 0
    # the final newline terminates the last line; n lines need n + 1 newlines before them
    while pos > 0:
        step = min(block, pos)
        pos -= step
        os.lseek(fd, pos, os.SEEK_SET)
        data = os.read(fd, step)
        for i in range(len(data) - 1, -1, -1):
            if data[i] == 0x0A and pos + i != end - 1:
                found += 1
                if found == n:
                    return pos + i + 1
    return 0


class Follower:
    def __init__(self, path, last_lines=10, poll=0.1, stats: ReadStats | None = None):
        self.path = os.fspath(path)
        self.last_lines = last_lines
        self.poll = poll
        self.stats = stats if stats is not None else ReadStats()
        self.rotations = 0
        self._fd = None
        self._ino = None
        self._buf = b""
        self._seen_missing = False    # the file was absent once: when it appears, read it all

    def _open(self, from_start) -> bool:
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return False
        st = os.fstat(fd)
        self._fd, self._ino, self._buf = fd, (st.st_dev, st.st_ino), b""
        os.lseek(fd, 0 if from_start else _start_of_last_lines(fd, self.last_lines), os.SEEK_SET)
        self.stats.files.append(self.path)
        return True

    def _drain(self):
        out = []
        while True:
            chunk = os.read(self._fd, 1 << 20)
            if not chunk:
                break
            data = self._buf + chunk
            lines = data.split(b"\n")
            self._buf = lines.pop()          # incomplete last line (b"" when data ended with a newline)
            for line in lines:
                d = parse_line(line.decode("utf-8", "replace"), self.stats)
                if d is not None:
                    out.append(d)
        return out

    def _rotated(self) -> bool:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return False                      # mid-rotation: the new file is not there yet
        if (st.st_dev, st.st_ino) != self._ino:
            return True
        return st.st_size < os.lseek(self._fd, 0, os.SEEK_CUR)   # truncated in place

    def poll_once(self) -> list:
        """Records that arrived since the last call (possibly none)."""
        if self._fd is None:
            # like tail -F: a file that appears (or reappears after a rotation) is new, read from its start
            if self._open(from_start=self._seen_missing):
                return self._drain()
            self._seen_missing = True
            return []
        out = self._drain()
        if self._rotated():
            out += self._drain()              # whatever the old file got before it was renamed
            if self._buf.strip():             # a cut line at the end of a rotated file will never complete
                parse_line(self._buf.decode("utf-8", "replace"), self.stats)
            os.close(self._fd)
            self._fd = None
            self.rotations += 1
            if self._open(from_start=True):
                out += self._drain()
            else:
                self._seen_missing = True
        return out

    def follow(self, timeout=None, stop=None):
        """Yields records as they arrive, until `timeout` seconds pass or stop() returns True."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            got = self.poll_once()
            yield from got
            if stop is not None and stop():
                return
            if deadline is not None and time.monotonic() >= deadline:
                return
            if not got:
                time.sleep(self.poll)

    def close(self):
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
