import torch  # noqa: F401  (loads libtorch before our library)

from . import _C  # noqa: F401  (registers the torch_convgrad ops)
