"""Registers the DTensor sharding strategies (``_dtensor``) once DTensor is imported.

Importing ``torch.distributed.tensor`` takes about a second, which a user who
never touches DTensor should not pay on ``import torch_convgrad``. So the
strategies are registered right away when DTensor is already imported, and
otherwise right after its package finishes importing.
"""
import importlib.abc
import importlib.machinery
import sys

_DTENSOR = "torch.distributed.tensor"


def _register():
    from . import _dtensor  # noqa: F401  (registers on import)


class _RegisterAfterDTensorImport(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname != _DTENSOR:
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_register(module):
            exec_module(module)
            _register()

        spec.loader.exec_module = exec_then_register
        return spec


if _DTENSOR in sys.modules:
    _register()
else:
    sys.meta_path.insert(0, _RegisterAfterDTensorImport())
