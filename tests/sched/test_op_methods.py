"""Each op's Executor method and module-level function are generated from its spec: the signature is
the prepare's parameters followed by keyword-only backend, stream, split and wait, the docstring the
prepare's."""
import concurrent.futures
import gc
import inspect

import numpy as np
import pytest

import hipsched as hs
from hipsched.executor import Executor
from hipsched.ops import OPS

P = inspect.Parameter


def _expected(op):
    return list(inspect.signature(OPS[op].prepare).parameters.values())


def _check(params, op):
    prep = _expected(op)
    assert [(p.name, p.kind, p.default) for p in params[:len(prep)]] == \
        [(p.name, p.kind, p.default) for p in prep]
    rest = params[len(prep):]
    assert [(p.name, p.kind, p.default) for p in rest] == \
        [("backend", P.KEYWORD_ONLY, "auto"), ("stream", P.KEYWORD_ONLY, None), ("split", P.KEYWORD_ONLY, None),
         ("wait", P.KEYWORD_ONLY, True)]


@pytest.mark.parametrize("op", list(OPS))
def test_executor_method_signature_and_doc(op):
    method = getattr(Executor, op)
    params = list(inspect.signature(method).parameters.values())
    assert params[0].name == "self"
    _check(params[1:], op)
    assert OPS[op].prepare.__doc__, f"{op}'s prepare has no docstring"
    assert method.__doc__ == OPS[op].prepare.__doc__
    assert method.__name__ == op and method.__qualname__ == f"Executor.{op}"


@pytest.mark.parametrize("op", list(OPS))
def test_module_function_signature_and_doc(op):
    fn = getattr(hs, op)
    _check(list(inspect.signature(fn).parameters.values()), op)
    assert fn.__doc__ == OPS[op].prepare.__doc__


def test_generated_method_passes_arguments_as_written():
    """Required parameters go in the tuple and those with a default in the dict (None when there are
    none), straight to _call with the method's own keywords as given (the dispatcher's call reads those
    in C); the signature shown still names them."""
    seen = []

    class Fake:
        def _call(self, *args, **kwargs):
            seen.append((args, kwargs))
            return "ran"

    f = Fake()
    assert Executor.add(f, 1, 2) == "ran"
    assert Executor.softmax(f, 3, 0, backend="cpu") == "ran"
    assert Executor.attention(f, 1, 2, 3) == "ran"
    assert Executor.top_k(f, 1, 2, 3, stream="s", split=False) == "ran"
    assert Executor.softmax(f, 3, 0, backend="gpu", split=False, wait=False) == "ran"
    assert seen == [(("add", {}, (1, 2), None), {}),
                    (("softmax", {"backend": "cpu"}, (3,), {"axis": 0}), {}),
                    (("attention", {}, (1, 2, 3), {"causal": False, "scale": None, "kv_len": None}), {}),
                    (("top_k", {"stream": "s", "split": False}, (1, 2, 3), None), {}),
                    (("softmax", {"backend": "gpu", "split": False, "wait": False}, (3,), {"axis": 0}), {})]
    with pytest.raises(TypeError):
        Executor.add(f, 1, 2, 3)
    assert list(inspect.signature(Executor.add).parameters) == ["self", "a", "b", "backend", "stream", "split",
                                                                "wait"]


def test_the_dispatchers_call_routes_wait_and_split(rng):
    """wait=False submits (a Future), anything but True or False is refused by name, and the Executor's
    submission is held weakly: a dispatcher outliving its Executor says so instead of keeping it."""
    a = rng.standard_normal(8).astype(np.float32)
    with hs.Executor(persist_model=False) as ex:
        fut = ex.add(a, a, wait=False)
        assert isinstance(fut, concurrent.futures.Future)
        assert np.array_equal(fut.result(), a + a)
        with pytest.raises(TypeError, match="wait must be True or False"):
            ex.add(a, a, wait=None)
        assert np.array_equal(ex.add(a, a, split=False), a + a)
        with pytest.raises(TypeError, match="unexpected keyword argument 'backnd'"):
            ex.add(a, a, backnd="gpu")
        with pytest.raises(ValueError):
            ex.add(a, a, backend="tpu")
        fast = ex._fast
    del ex, fut
    gc.collect()
    with pytest.raises(RuntimeError, match="wait=False needs the Executor"):
        fast.call("add", {"wait": False}, (a, a), None)
    assert np.array_equal(fast.call("add", {}, (a, a), None), a + a)
