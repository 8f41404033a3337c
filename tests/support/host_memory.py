"""HostMemoryRuntime (the memory part of the Runtime interface on host memory) and run_bounded, a
subprocess runner that turns a deadlock into a failure with the hung stack; shared by the resident cache,
finalizer lock and device array tests."""
import subprocess
import sys
import textwrap

RUNTIME = '''
import ctypes


class HostMemoryRuntime:
    """The memory part of the Runtime interface on host memory; `freed` lists the pointers freed."""
    platform = "amd"

    def __init__(self):
        self.buffers, self.freed = {}, []

    def current_device(self):
        return 0

    def malloc(self, n):
        buf = ctypes.create_string_buffer(n)
        self.buffers[ctypes.addressof(buf)] = buf
        return ctypes.addressof(buf)

    def free(self, ptr):
        self.freed.append(ptr)
        del self.buffers[ptr]

    def memcpy_htod(self, dst, src, n, stream=0):
        ctypes.memmove(dst, src, n)

    def memcpy_dtoh(self, dst, src, n, stream=0):
        ctypes.memmove(dst, src, n)

    def stream_synchronize(self, s):
        pass
'''
exec(RUNTIME)


def run_bounded(code: str, seconds: int = 30) -> str:
    """Run `code` in a fresh interpreter that dumps its threads and exits if it has not finished within
    `seconds`: a deadlock then fails the test with the stack that hung instead of hanging CI."""
    prelude = f"import faulthandler, sys\nfaulthandler.dump_traceback_later({seconds}, exit=True)\n"
    r = subprocess.run([sys.executable, "-c", prelude + RUNTIME + textwrap.dedent(code)], capture_output=True,
                       text=True, timeout=seconds + 30)
    assert r.returncode == 0 and "ok" in r.stdout, f"exit {r.returncode}\n{r.stdout}\n{r.stderr[-4000:]}"
    return r.stdout
