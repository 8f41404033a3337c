"""Each op's Executor method and module-level function are generated from its spec: the signature is
the prepare's parameters followed by keyword-only backend, stream, split and wait, the docstring the
prepare's."""
import inspect

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
    """Required parameters go positionally and those with a default by keyword, straight to _run."""
    seen = []

    class Fake:
        def _run(self, *args, **kwargs):
            seen.append((args, kwargs))
            return "ran"

        def _run_whole(self, *args, **kwargs):
            seen.append(("whole", args, kwargs))
            return "ran whole"

        def _submitted(self, *args, **kwargs):
            seen.append(("submitted", args, kwargs))
            return "submitted"

    f = Fake()
    assert Executor.add(f, 1, 2) == "ran"
    assert Executor.softmax(f, 3, 0, backend="cpu") == "ran"
    assert Executor.attention(f, 1, 2, 3) == "ran"
    assert Executor.top_k(f, 1, 2, 3, stream="s") == "ran"
    assert seen == [(("add", "auto", None, 1, 2), {}),
                    (("softmax", "cpu", None, 3), {"axis": 0}),
                    (("attention", "auto", None, 1, 2, 3), {"causal": False, "scale": None, "kv_len": None}),
                    (("top_k", "auto", "s", 1, 2, 3), {})]
    # split=False keeps the call whole; True and None leave it to the model
    assert Executor.top_k(f, 1, 2, 3, split=False) == "ran whole"
    assert Executor.top_k(f, 1, 2, 3, split=True) == "ran"
    assert seen[-2:] == [("whole", ("top_k", "auto", None, 1, 2, 3), {}), (("top_k", "auto", None, 1, 2, 3), {})]
    # wait=False (or anything but True, which _submitted refuses) submits, with backend, stream and split
    assert Executor.softmax(f, 3, 0, backend="gpu", split=False, wait=False) == "submitted"
    assert seen[-1] == ("submitted", ("softmax", "gpu", None, False, False, 3), {"axis": 0})
    with pytest.raises(TypeError):
        Executor.add(f, 1, 2, 3)
