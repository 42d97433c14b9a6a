#!/usr/bin/env bash
# Installs what building and testing torch_convgrad needs, keeping an installed
# torch 2.11-2.14. With no usable torch it installs torch==2.13.0 exactly: an
# unpinned `pip install torch` would fetch a multi-GB CUDA build.
set -euo pipefail
PYTHON=${PYTHON:-python3}
if ! "$PYTHON" - <<'PY'
import sys
try:
    import torch
except ImportError:
    sys.exit(1)
major, minor = (int(part) for part in torch.__version__.split("+")[0].split(".")[:2])
sys.exit(0 if (2, 11) <= (major, minor) <= (2, 14) else 1)
PY
then
  "$PYTHON" -m pip install --quiet "torch==2.13.0"
fi
"$PYTHON" -m pip install --quiet ninja "setuptools>=64" wheel -r "$(dirname "$0")/../requirements-test.txt"
