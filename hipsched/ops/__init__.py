"""Op descriptors: each family module registers a prepare(*args, **kwargs) -> Call for its ops."""
from .base import OPS, Call, OpSpec, OpType, register  # noqa: F401
from . import elementwise, similarity, linalg, quant, attention, graph  # noqa: F401,E402  (registers)
