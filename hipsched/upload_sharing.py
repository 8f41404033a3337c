"""The upload a GPU decision charges a call whose host inputs earlier calls already passed: the rule
that lets a reused corpus become resident, beside the model it feeds (the charged bytes are the h2d
term of SchedCore's decision; the copies a GPU run really makes are what the model learns from).

The upload a decision charges this call: an input the GPU would keep resident (the backend's
`would_keep`: bytes that cannot change unseen, within the resident budget) and that earlier
calls already passed is charged its upload divided by its uses so far, this one included.
Charging every call the whole upload made the scheduler keep a reused corpus on the CPU for
good, since only a GPU run makes it resident (on the H100, 64
top_k calls over one 231 MB corpus ran on the CPU at 7.7 ms, against 0.33 ms resident). With
this rule the upload is paid once the CPU time lost by not paying it would exceed it (the
ski-rental rule: at most twice the best of either choice in hindsight). The reduction is
capped at the call's upload, which counts only inputs not already resident.
The rule also learns what inputs are worth: for each of the last new inputs it notes what the
calls that passed it would have saved on the GPU with it resident (the model's predictions), by
the time the next new input came, per byte of the input. With a few noted, a new input is
expected to save the median of those figures times its bytes, and a call is charged the upload
in proportion to its own saving over that expectation, when that is less: the upload is then
worth paying exactly when the calls over an input are expected to save more than it costs, and
each call gains (how `hipsched demo --oracle` shares an upload, learned from the calls so far
instead of known in hindsight; a search that runs each new corpus slice through its queries and
a cosine pays the slice's upload at its first query, which the cosine would pay anyway). Per
byte, because the totals grow with the inputs: noted as they were, the median of the smaller
slices' totals fell below what one query saved on a new slice of the simulated H100's demo,
every slice fell back to the plain rule, and the first half of its queries ran on the CPU
(calibrated, judged by the oracle: 92.5% of calls on the faster side, regret 26%; per byte:
97.3%, 4.3%). An input still in use when the next comes
(weights reused by every layer) is noted short of its total, so the prediction errs towards the
plain rule. A writable array is uploaded by every GPU call that takes it (a change to it could
not be seen), so its upload is never shared, and neither is any on a backend that cannot say
what it keeps."""
from __future__ import annotations

import threading
import weakref
from collections import deque

from .backends.interface import KEEP_QUERY_MIN_BYTES as REUSE_MIN_BYTES  # inputs the judge asks about
from .ops.base import host_arrays
_REUSE_MAX_TRACKED = 4096   # arrays whose uses are counted at once (dead ones go first when full)
# how many of the last inputs' predicted savings per byte are kept (their median predicts a new input's
# worth), and how many make a prediction
_USE_HISTORY = 32
_USE_HISTORY_MIN = 3


class UploadSharing:
    """Per executor: the host inputs whose uploads are shared, and what the last new ones were worth."""

    def __init__(self):
        # id(host array) -> [weakref, calls that passed it, a GPU run took it, predicted us those calls
        # would save on the GPU with it resident, its bytes]
        self.uses = {}
        # predicted time saved on the GPU per byte by the calls that passed each of the last new inputs,
        # by the time the next new one came, and the entry of the newest
        self.gain_history = deque(maxlen=_USE_HISTORY)
        self.newest_use = None
        self.lock = threading.Lock()

    def charge(self, call, judged, resident_gain, commit: bool) -> float:
        """The host->device bytes a decision charges `call`, of the `judged.h2d` its run would upload:
        `judged` is the GPU backend's Judgement (its `inputs` say which large host inputs are resident
        and which a run would keep); `resident_gain(call)` is the microseconds the model predicts it
        saves on the GPU with its inputs resident. Without `commit` (a what-if question) the inputs'
        uses are not counted."""
        h2d = judged.h2d
        if not judged.inputs:
            return h2d
        saved = 0.0
        gain = resident_gain(call)
        with self.lock:
            history = self.gain_history
            per_byte = sorted(history)[len(history) // 2] if len(history) >= _USE_HISTORY_MIN else 0.0
            for a, trusted, resident, keeps in judged.inputs:
                e = self._live_entry(a)
                k = e[1] if e is not None else 0
                # an input a GPU run already took and that this call would upload again was not kept
                # (a backend without a resident cache, or evicted): its uploads are not shared
                kept = e is None or not e[2] or h2d < a.nbytes
                # an input already resident is not in h2d: nothing of it to spread
                if kept and keeps and not resident:
                    share = 1.0 / (k + 1)
                    if per_byte > 0.0 and gain > 0.0:
                        share = min(share, gain / (per_byte * a.nbytes))
                    saved += a.nbytes * (1.0 - share)
                if commit:
                    self._count(a, e, gain)
        return max(0.0, h2d - saved)

    def count(self, call, gain: float) -> None:
        """Count the uses of `call`'s large host inputs as `charge(..., commit=True)` does, for a call
        decided without the GPU's judgement (one the GPU lost with its copies free: `gain`, what the
        model predicts it would save with its inputs resident, is small or 0 there). Its inputs were
        passed all the same: a later call over them shares their upload with this one."""
        arrays = host_arrays(call.args, REUSE_MIN_BYTES)
        if not arrays:
            return
        with self.lock:
            for a, _ in arrays:
                self._count(a, self._live_entry(a), gain)

    def _live_entry(self, a):
        """The uses entry of host input `a`, or None (none yet, or a dead array's id reused)."""
        e = self.uses.get(id(a))
        return e if e is not None and e[0]() is a else None

    def _count(self, a, e, gain: float) -> None:
        """One more use of host input `a` (`e`: its live entry, or None), under the lock."""
        uses = self.uses
        if e is not None:
            e[1] += 1
            e[3] += gain
            return
        if len(uses) >= _REUSE_MAX_TRACKED:
            for key in [key for key, v in uses.items() if v[0]() is None]:
                del uses[key]
            if len(uses) >= _REUSE_MAX_TRACKED:
                uses.clear()
        try:
            entry = [weakref.ref(a), 1, False, gain, a.nbytes]
        except TypeError:
            return
        uses[id(a)] = entry
        if self.newest_use is not None:
            n = self.newest_use
            self.gain_history.append(n[3] / n[4])
        self.newest_use = entry

    def taken_by_gpu(self, call) -> None:
        """A GPU run uploaded `call`'s host inputs (those its judgement lists): the next call passing one
        of them that would upload it again shows it was not kept (see `charge`)."""
        with self.lock:
            for a, *_ in call.judged.inputs:
                e = self._live_entry(a)
                if e is not None:
                    e[2] = True
