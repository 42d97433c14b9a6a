PYTHON ?= python3

.PHONY: deps build run test test-torch-2.14 fuzz sanitize bench

deps:
	PYTHON=$(PYTHON) bash scripts/install_deps.sh

# Builds torch_convgrad/_C in place (incremental: ninja keeps its objects in build/).
build: deps
	$(PYTHON) setup.py --quiet build_ext --inplace

run: build
	$(PYTHON) -m torch_convgrad

test: build
	$(PYTHON) -m pytest tests

# The property test with 20,000 random attribute sets instead of 300.
fuzz: build
	$(PYTHON) -m pytest tests/test_fuzz.py --hypothesis-profile=fuzz --hypothesis-show-statistics

# The suite on torch 2.14.1 (a CUDA build, so the CUDA kernels are linked too),
# in its own venv under build/ and its own copy of the tree.
test-torch-2.14:
	PYTHON=$(PYTHON) bash scripts/test_other_torch.sh 2.14.1

# The error, edge-case, sweep and algorithm tests on an ASan+UBSan build (its own tree under build/).
sanitize: deps
	PYTHON=$(PYTHON) bash scripts/sanitize.sh

bench: build
	PYTHONPATH=. $(PYTHON) benchmarks/bench_weight_gradient.py
