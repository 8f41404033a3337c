"""CpuBackend: runs a validated Call through the C kernels (hipsched/cpu/_<family> extensions).
Each op's spec names a function `f(*call.args, **call.params)` taking C-contiguous float32 host
arrays (or op objects such as QuantizedTensor) and returning NumPy results. Calls whose inputs live
on a GPU run here too (a fallback, or a call too small for a launch): their inputs come down, the
result goes back up to the inputs' device."""
from __future__ import annotations

import numpy as np

from ..dlpack_devices import is_device_array
from ..ops import OPS
from ..ops.base import Call, run_kernel

# op -> (module, function) of its CPU kernel, as the op specs declare it
CPU_IMPLS = {name: spec.cpu for name, spec in OPS.items()}


class CpuBackend:
    name = "cpu"
    available = True

    def __init__(self):
        self._fns = {}

    def _load(self, op):
        f = OPS[op].cpu_function()
        self._fns[op] = f
        return f

    def run(self, call, stream=None):
        """Run on host arrays (see run_device_data for a call whose inputs live on a GPU), into call.out
        when the call has one."""
        return run_kernel(self._fns.get(call.op) or self._load(call.op), call)

    def run_device_data(self, call):
        """Download the device inputs, run, and upload the result (each array of a tuple) onto the
        inputs' own runtime, their device, not whichever runtime the process would pick first; results
        come back as the inputs' library's arrays (hipsched.gpu.memory.device_array.callers_arrays)."""
        # deferred: the GPU layer only for device arrays; the CPU backend loads where it is missing or broken
        from ..gpu.memory.device_array import callers_arrays, to_device, to_host
        host_args = tuple(to_host(a) if is_device_array(a) else a for a in call.args)
        out = self.run(Call(call.op, host_args, call.params, call.size, call.nbytes, call.dtype, False))
        rt = next((getattr(a, "runtime", None) for a in call.args if is_device_array(a)), None)
        out = tuple(to_device(o, runtime=rt) for o in out) if isinstance(out, tuple) else to_device(out, runtime=rt)
        return callers_arrays(out, call.args)

    @staticmethod
    def wait_device_inputs(call) -> None:
        """Wait for the work queued where run_device_data's downloads of `call`'s device inputs would wait
        (their streams; the legacy null stream: every blocking stream), so that a timed CPU run starts
        with its inputs ready. That wait is the GPU's queued work, each piece timed as the GPU's by its own
        events: counted in the CPU's sample too, a device pipeline's first CPU run after a burst of
        queued GPU calls looked as slow as the whole queue (170 ms for a 0.3 ms add on the asynchronous
        emulator), and the pipeline never left a GPU it had measured slower than the CPU."""
        # deferred: the GPU layer only for device arrays (as run_device_data)
        from ..gpu.memory.device_array import DeviceArray
        for a in _arrays(call.args):
            if type(a) is not np.ndarray and is_device_array(a):
                (a if isinstance(a, DeviceArray) else DeviceArray.from_external(a)).wait()

    @staticmethod
    def device_copy_bytes(call) -> tuple[int, int]:
        """(host->device, device->host) bytes run_device_data copies: the results go up (what the call
        writes: call.nbytes beyond its inputs), its device inputs come down."""
        down = inputs = 0
        for a in _arrays(call.args):
            n = int(getattr(a, "nbytes", 0) or 0)
            inputs += n
            if type(a) is not np.ndarray and is_device_array(a):
                down += n
        return max(0, int(call.nbytes) - inputs), down


def _arrays(args):
    for a in args:
        if isinstance(a, (tuple, list)):
            yield from _arrays(a)
        else:
            yield a
