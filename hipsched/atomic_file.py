"""Atomic file replacement: write a temp file in the target's directory, then os.replace it over the
target, so readers and concurrent writers never see a partial file (kernel cache, model store)."""
from __future__ import annotations

import os
import tempfile


def atomic_write(path, data: bytes, prefix: str = ".tmp-", suffix: str = ".tmp") -> None:
    directory = os.path.dirname(os.fspath(path)) or "."
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=prefix, suffix=suffix)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
