PYTHON ?= python3

.PHONY: deps build run test fuzz sanitize bench gpu-check

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

# The suite on another supported torch release, in its own venv under build/
# and its own copy of the tree: make test-torch-2.11.0 (and so on). PyPI's
# wheels of these are CUDA builds, so the CUDA kernels are linked too. 2.14.1
# lies on this project's machines' disk; 2.11.0 and 2.12.1 are downloaded
# (about 3 GB each).
TORCH_RELEASES := 2.11.0 2.12.1 2.14.1
TORCH_TARGETS := $(addprefix test-torch-,$(TORCH_RELEASES))
.PHONY: $(TORCH_TARGETS) test-torch-2.14
$(TORCH_TARGETS): test-torch-%:
	PYTHON=$(PYTHON) bash scripts/test_other_torch.sh $*
test-torch-2.14: test-torch-2.14.1

# The error, edge-case, sweep and algorithm tests on an ASan+UBSan build (its own tree under build/).
sanitize: deps
	PYTHON=$(PYTHON) bash scripts/sanitize.sh

bench: build
	PYTHONPATH=. $(PYTHON) benchmarks/bench_weight_gradient.py

# On a GPU machine: build, the suite's CUDA cases and the CUDA benchmark, each step time-limited
# and logged under OUT (failures' tracebacks as they happen); no install step, since lent
# machines are offline. See scripts/gpu_check.sh.
OUT ?= build/gpu-check
gpu-check:
	PYTHON=$(PYTHON) bash scripts/gpu_check.sh $(OUT)
