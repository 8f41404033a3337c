"""Op specs: each module here declares its ops with `register` (see base.OpSpec); importing this
package registers them all, and everything else (backends, chunking, calibration, the executor, the
public op list) reads OPS. Modules are found, not listed, so a new op is one new module (or one more
`register` in an existing one) and nothing else here."""
import importlib as _importlib
import pkgutil as _pkgutil
from enum import Enum

from .base import OPS, Call, OpSpec, register  # noqa: F401

for _info in _pkgutil.iter_modules(__path__):
    if _info.name != "base":
        _importlib.import_module(f"{__name__}.{_info.name}")
del _info

OpType = Enum("OpType", {name.upper(): name for name in OPS}, type=str)
