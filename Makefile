# Two commands set up a fresh machine:  `make demo` (install + run the main job on the tiny model)
# and `make test` (install + the test suite). On a CPU-only machine the CPU torch wheel is
# installed first, so pip never pulls the multi-GB CUDA build.
PY ?= python3
TORCH_CPU ?= torch==2.13.0

.PHONY: install demo test chain gpu-test bench

install:
	@$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q $(TORCH_CPU)
	$(PY) -m pip install -q -e ".[test]"

demo: install
	$(PY) scripts/check_chain.py

test: install
	$(PY) -m pytest -q

chain:
	$(PY) scripts/check_chain.py

gpu-test:
	$(PY) -m pytest -q -m gpu

bench:
	$(PY) scripts/bench_attention.py
