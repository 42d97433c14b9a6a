PYTHON ?= python3

.PHONY: deps build run test bench

deps:
	PYTHON=$(PYTHON) bash scripts/install_deps.sh

# Builds torch_convgrad/_C in place (incremental: ninja keeps its objects in build/).
build: deps
	$(PYTHON) setup.py --quiet build_ext --inplace

run: build
	$(PYTHON) -m torch_convgrad

test: build
	$(PYTHON) -m pytest tests

bench: build
	PYTHONPATH=. $(PYTHON) benchmarks/bench_weight_gradient.py
