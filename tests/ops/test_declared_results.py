"""Every op declares what it returns (OpSpec.result: shape and dtype, without running it), so that a
batch can plan a call on another call's result before it exists (hipsched/batch.py, the graph plan).
The declaration must be the real result's shape and dtype for every op, dtype and form the op matrix
builds (tests/support/op_cases.py), run through the Executor on the CPU."""
import numpy as np
import pytest

import hipsched as hs
from hipsched.ops import OPS
from op_cases import CASES


def _cases():
    params = []
    for op, spec in OPS.items():
        case = CASES.get(op)
        if case is None:
            params.append(pytest.param(op, None, None, id=f"{op}-has-no-builder"))
            continue
        for dtype in dict.fromkeys(spec.cpu_dtypes + case.variants):
            for form in case.forms:
                params.append(pytest.param(op, dtype, form, id=f"{op}-{dtype.replace('/', '-')}-{form}"))
    return params


def _shape_dtype(a):
    a = np.asarray(a)
    return tuple(a.shape), a.dtype.name


@pytest.mark.parametrize("op,dtype,form", _cases())
def test_the_declared_result_is_the_real_one(op, dtype, form):
    assert op in CASES, f"{op}: no argument builder in tests/support/op_cases.py"
    spec = OPS[op]
    assert spec.result is not None, f"{op}: declares no result (register(..., result=fn))"
    args, kwargs = CASES[op].make(np.random.default_rng(3), dtype, form)
    declared = spec.result(spec.prepare(*args, **kwargs))
    with hs.Executor(persist_model=False, telemetry_path=None) as ex:
        got = getattr(ex, op)(*args, backend="cpu", **kwargs)
    if isinstance(got, tuple):
        assert declared == tuple(_shape_dtype(g) for g in got)
    else:
        assert declared == _shape_dtype(got)


def test_a_stand_in_has_the_declared_shape_and_dtype():
    from hipsched.ops.base import stand_in
    for dtype in ("float32", "float16", "bfloat16", "int64"):
        a = stand_in((3, 5), dtype)
        assert _shape_dtype(a) == ((3, 5), dtype) and not a.any()
