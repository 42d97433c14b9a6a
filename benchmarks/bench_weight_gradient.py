"""Benchmarks: torch_convgrad against the hand-written ATen glue, with a roofline.

    PYTHONPATH=. python benchmarks/bench_weight_gradient.py [options]

The same as ``python -m torch_convgrad bench [options]``; the code and the
options are in ``torch_convgrad/benchmark.py`` (``--help`` lists them).
"""
import sys

from torch_convgrad.benchmark import main

if __name__ == "__main__":
    sys.exit(main())
