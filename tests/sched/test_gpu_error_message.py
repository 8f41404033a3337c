"""GpuError.message: the text without the [kind/name] prefix str() shows; kept through pickling."""
import pickle

from hipsched.errors import GpuError


def test_gpu_error_message_and_pickle():
    e = GpuError("oom", "out of memory] really", name="hipErrorOutOfMemory")
    assert str(e) == "[oom/hipErrorOutOfMemory] out of memory] really"
    assert e.message == "out of memory] really" == str(e).split("] ", 1)[-1]
    f = pickle.loads(pickle.dumps(e))
    assert (f.kind, f.name, f.message, str(f)) == (e.kind, e.name, e.message, str(e))
    assert GpuError("nonsense", "m").message == "m"
