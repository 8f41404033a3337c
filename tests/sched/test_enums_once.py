"""The reasons and strategies are defined once (_sched's enums, config.STRATEGIES); the public Python
enums are built from them, with the names and values they have always had."""
import pickle

from hipsched import _sched
from hipsched.config import STRATEGIES
from hipsched.scheduling import REASONS, ExecutionStrategy, SelectionReason

# the public values, as logs, saved models and users' code spell them
PUBLIC_REASONS = ["gpu_available", "gpu_unavailable", "cpu_fallback", "cost_model", "memory_constraint",
                  "user_preference", "below_min_batch", "gpu_unhealthy", "exploring", "gpu_unsupported", "split"]
PUBLIC_STRATEGIES = ["automatic", "gpu_preferred", "cpu_preferred", "backend_only"]


def test_reasons_public_names_and_values():
    assert [(m.name, m.value) for m in SelectionReason] == [(v.upper(), v) for v in PUBLIC_REASONS]
    assert list(_sched.REASONS) == PUBLIC_REASONS
    assert [r.value for r in REASONS] == PUBLIC_REASONS
    assert all(isinstance(m, str) for m in SelectionReason) and SelectionReason("cost_model") == "cost_model"
    for m in _sched.Reason:       # the core's index of each reason names that reason
        assert REASONS[int(m)] is SelectionReason[m.name[2:]]
    for m in SelectionReason:
        assert m.name in SelectionReason.__doc__


def test_strategies_public_names_and_values():
    assert list(STRATEGIES) == PUBLIC_STRATEGIES
    assert [(m.name, m.value) for m in ExecutionStrategy] == [(v.upper(), v) for v in PUBLIC_STRATEGIES]
    for m in _sched.Strategy:
        assert STRATEGIES[int(m)] == ExecutionStrategy[m.name[3:]]


def test_enums_pickle():
    for m in (SelectionReason.COST_MODEL, ExecutionStrategy.GPU_PREFERRED):
        assert pickle.loads(pickle.dumps(m)) is m

