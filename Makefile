# Two commands set up a fresh machine: `make demo` (install + run every stage on the tiny model)
# and `make test` (install + the test suite). Both first run `install`:
#
#   * where: a project-local virtualenv .venv (made with $(BASE_PY) -m venv), so a system Python
#     that refuses `pip install` (PEP 668, "externally managed") is never touched. Inside an
#     active virtualenv (VIRTUAL_ENV set) that one is used instead; PY=/path/to/python picks any
#     interpreter yourself.
#   * torch: on Linux with no NVIDIA GPU, the CPU wheel from PyTorch's CPU index, probed with a
#     short timeout and falling back to the default index when unreachable; elsewhere the default
#     index. TORCH_INDEX=cpu|default|<url> overrides; TORCH_CPU_INDEX and TORCH_PROBE_TIMEOUT
#     (seconds) set the CPU index and how long to wait for it. scripts/install.py prints each
#     choice and why, then pip's own output, and names any setting it did not use.
#   * skipped when already done: a stamp keyed on pyproject.toml and the interpreter. FORCE=1 redoes it.
#
# Variables (make test VAR=value): BASE_PY, VENV, PY, TORCH, TORCH_INDEX, TORCH_CPU_INDEX,
# TORCH_PROBE_TIMEOUT, FORCE.

BASE_PY ?= python3
VENV ?= .venv
TORCH ?= torch==2.13.0
TORCH_INDEX ?= auto
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
TORCH_PROBE_TIMEOUT ?= 5
FORCE ?=

ifeq ($(origin PY),undefined)
  ifneq ($(VIRTUAL_ENV),)
    PY := $(VIRTUAL_ENV)/bin/python
    PY_WHY := the active virtualenv (VIRTUAL_ENV=$(VIRTUAL_ENV))
  else
    PY := $(VENV)/bin/python
    PY_WHY := the project virtualenv $(VENV)
    NEED_VENV := $(VENV)/bin/python
  endif
else
  PY_WHY := PY=$(PY) as given
endif

# A setting that has no effect says so (it would otherwise be silently ignored).
ifeq ($(NEED_VENV),)
  ifneq ($(filter command line environment,$(origin VENV) $(origin BASE_PY)),)
    $(info make: VENV/BASE_PY ignored: no project virtualenv is made when using $(PY_WHY))
  endif
endif

.PHONY: install demo test chain gpu-test bench clean-venv

install: $(NEED_VENV)
	@command -v "$(PY)" >/dev/null 2>&1 || { \
	  echo "make: error: $(PY) not found ($(PY_WHY)). Give an existing interpreter: PY=/path/to/python" >&2; exit 1; }
	@$(PY) scripts/install.py --torch "$(TORCH)" --torch-index "$(TORCH_INDEX)" \
	  --given "$(foreach v,TORCH TORCH_INDEX TORCH_CPU_INDEX TORCH_PROBE_TIMEOUT,$(if $(filter command line environment,$(origin $(v))),$(v)))" \
	  --cpu-index "$(TORCH_CPU_INDEX)" --probe-timeout "$(TORCH_PROBE_TIMEOUT)" \
	  $(if $(FORCE),--force) --why "$(PY_WHY)"

# The project virtualenv. Debian/Ubuntu ship `venv` without `ensurepip` unless python3-venv is
# installed; `python3 -m venv` then fails halfway, so check first and never leave a half-made .venv.
$(VENV)/bin/python:
	@command -v "$(BASE_PY)" >/dev/null 2>&1 || { \
	  echo "make: error: $(BASE_PY) not found. Install Python >= 3.10, or name one: BASE_PY=python3.11" >&2; exit 1; }
	@$(BASE_PY) -c "import venv, ensurepip" 2>/dev/null || { \
	  echo "make: error: '$(BASE_PY) -m venv' cannot make a virtualenv here (module venv or ensurepip missing)." >&2; \
	  echo "      Fix: sudo apt install python3-venv  (Debian/Ubuntu; python3.X-venv for a non-default 3.X)," >&2; \
	  echo "      or use an interpreter where pip install works: make $(or $(MAKECMDGOALS),install) PY=/path/to/python" >&2; \
	  exit 1; }
	@echo "make: creating the project virtualenv $(VENV) from $$($(BASE_PY) -c 'import sys; print(sys.executable, sys.version.split()[0])')"
	@$(BASE_PY) -m venv "$(VENV)" || { rm -rf "$(VENV)"; \
	  echo "make: error: '$(BASE_PY) -m venv $(VENV)' failed (message above); removed the partial $(VENV)." >&2; exit 1; }

demo: install
	$(PY) scripts/check_chain.py

test: install
	$(PY) -m pytest -q

chain: install
	$(PY) scripts/check_chain.py

gpu-test: install
	$(PY) -m pytest -q -m gpu

bench: install
	$(PY) scripts/bench_attention.py

# Removes the project virtualenv and the install stamp; the next make demo/test starts from scratch.
clean-venv:
	rm -rf "$(VENV)" .install-stamps
