"""The plain C functions of the extension library, through ctypes.

The extension module has no Python API (it is built against CPython's stable
ABI and only registers ops), so the few queries that are not ops are exported
as C functions from the same library.
"""
import ctypes

from . import _C

library = ctypes.CDLL(_C.__file__)
library.torch_convgrad_force_algorithm.argtypes = [ctypes.c_char_p]
library.torch_convgrad_force_algorithm.restype = ctypes.c_int
for _name in ("torch_convgrad_forced_algorithm", "torch_convgrad_last_algorithm", "torch_convgrad_algorithm_names",
              "torch_convgrad_compiler", "torch_convgrad_cpu_calibration"):
    getattr(library, _name).argtypes = []
    getattr(library, _name).restype = ctypes.c_char_p


def compiler() -> str:
    """The compiler that built the extension, as it names itself (``__VERSION__``)."""
    return library.torch_convgrad_compiler().decode()
