"""A progress bar for long work (calibration, the demo): tqdm's, where someone watches it (a terminal,
or a Jupyter notebook, where tqdm draws its widget); nothing where nobody does (logs, CI, a pipe), since
a bar redrawn with carriage returns makes a mess of a log file."""
from __future__ import annotations

import sys


def _notebook(file) -> bool:
    # a notebook's stderr is ipykernel's stream, which is no terminal but shows tqdm's widget
    return type(file).__module__.startswith("ipykernel")


def progress(total: int, desc: str, enabled: bool = True, file=None):
    """A tqdm bar (update(k), set_postfix_str(s), close()); a disabled one, which draws nothing, when not
    enabled or when `file` (default stderr) is neither a terminal nor a notebook's output."""
    file = file or sys.stderr
    if _notebook(file):
        # deferred: tqdm is needed only by the commands that show progress, not by the ops or the log tools
        from tqdm.auto import tqdm
    else:
        from tqdm import tqdm  # deferred: as above
    shown = enabled and (_notebook(file) or (hasattr(file, "isatty") and file.isatty()))
    return tqdm(total=total, desc=desc, file=file, leave=True, dynamic_ncols=True, disable=not shown)
