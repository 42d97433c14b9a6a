PYTHON ?= python3

.PHONY: deps build run test bench

deps:
	PYTHON=$(PYTHON) bash scripts/install_deps.sh

build: deps
	$(PYTHON) -m pip install --quiet --no-build-isolation --no-deps -e .

run: build
	$(PYTHON) -m torch_convgrad

test: build
	$(PYTHON) -m pytest tests

bench: build
	$(PYTHON) benchmarks/bench_weight_gradient.py
