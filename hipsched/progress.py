"""A progress bar for long work (calibration, the demo): on a terminal tqdm when installed, else a plain
bar that redraws in place; elsewhere (logs, CI) sparse plain lines."""
from __future__ import annotations

import sys
import time


class _PlainBar:
    def __init__(self, total, desc, file):
        self.total, self.desc, self.file = total, desc, file
        self.n = 0
        self.tty = hasattr(file, "isatty") and file.isatty()
        self._last = 0.0
        self._postfix = ""

    def update(self, k=1):
        self.n += k
        now = time.monotonic()
        if self.n >= self.total or now - self._last >= (0.1 if self.tty else 5.0):
            self._last = now
            self._draw()

    def set_postfix_str(self, s):
        self._postfix = s

    def _draw(self):
        frac = self.n / self.total if self.total else 1.0
        bar = "#" * int(frac * 30)
        line = f"{self.desc}: [{bar:<30}] {self.n}/{self.total} {self._postfix}"
        self.file.write(("\r" + line) if self.tty else (line + "\n"))
        self.file.flush()

    def close(self):
        self._draw()
        if self.tty:
            self.file.write("\n")
        self.file.flush()


def progress(total: int, desc: str, enabled: bool = True, file=None):
    """A bar with update(k), set_postfix_str(s) and close(); a silent one when not enabled."""
    file = file or sys.stderr
    if not enabled:
        return _PlainBar(total, desc, _Null())
    if not (hasattr(file, "isatty") and file.isatty()):
        return _PlainBar(total, desc, file)  # tqdm's carriage returns make a mess of logs
    try:
        from tqdm import tqdm  # deferred: tqdm is optional (ImportError: the plain bar)
        return tqdm(total=total, desc=desc, file=file, leave=True, dynamic_ncols=True)
    except ImportError:
        return _PlainBar(total, desc, file)


class _Null:
    def write(self, s):
        pass

    def flush(self):
        pass
