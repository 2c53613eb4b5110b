# Two commands set up a fresh machine: `make demo` (install + run every stage on the tiny model)
# and `make test` (install + the default test tier). Both first run `install`, which is plain pip:
#
#   * where: a project-local virtualenv .venv (made with $(BASE_PY) -m venv), so a system Python
#     that refuses `pip install` (PEP 668, "externally managed") is never touched. Inside an active
#     virtualenv (VIRTUAL_ENV set) that one is used; PY=/path/to/python names any interpreter.
#   * torch first: on Linux with no NVIDIA GPU the CPU wheel from PyTorch's CPU index (the default
#     index's CUDA build is ~2.5 GB more); if that index does not answer within
#     TORCH_PROBE_TIMEOUT seconds, or pip fails there, the default index. Elsewhere the default
#     index. TORCH_INDEX=cpu|default|<url> overrides (no fallback then).
#   * then `pip install -e ".[test]"`; a stamp per interpreter, made when both succeed, lets the
#     next make skip the install until pyproject.toml changes. FORCE=1 reinstalls.
#
# Tests, in tiers (tests/conftest.py says what each holds):
#   make test           the default tier, under 2 minutes on 2 cores
#   make test-lessons   the lessons' exercises and quoted outputs, the chain on every tiny model
#   make test-deep      the hypothesis searches from scratch, every property test at depth
#   make gpu-test       the GPU tests (deselected on a machine without CUDA), GPU_TEST_JOBS processes
#                       (default 8) taking single tests: the 768 cases of one kernel sweep would
#                       otherwise sit in one process (one H200: 831 passed in about 2 minutes with 12)
#
# Variables (make test VAR=value): BASE_PY, VENV, PY, TORCH, TORCH_INDEX, TORCH_CPU_INDEX,
# TORCH_PROBE_TIMEOUT, FORCE, PYTEST_ARGS, TEST_JOBS, GPU_TEST_JOBS, SERVE_ARGS (make serve: stage 10's server).
#
# The three CPU tiers run through pytest-xdist: -n $(TEST_JOBS) processes (auto: one per core, at most
# 4) taking whole test files (--dist loadfile; tests/conftest.py shares two long files out test by
# test). TEST_JOBS=0 runs plain pytest in one process.

BASE_PY ?= python3
VENV ?= .venv
TORCH ?= torch==2.13.0
TORCH_INDEX ?= auto
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
TORCH_PROBE_TIMEOUT ?= 5
FORCE ?=
PYTEST_ARGS ?=
TEST_JOBS ?= auto
XDIST = -n $(TEST_JOBS) --maxprocesses=4 --dist loadfile
SERVE_ARGS ?=
GPU_TEST_JOBS ?= 8

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
given = $(filter command line environment,$(origin $(1)))
ifeq ($(NEED_VENV),)
  ifneq ($(call given,VENV)$(call given,BASE_PY),)
    $(info make: VENV/BASE_PY ignored: no project virtualenv is made when using $(PY_WHY))
  endif
endif

# Where torch comes from, and why (printed by the install).
NVIDIA := $(shell test -e /proc/driver/nvidia && echo /proc/driver/nvidia || command -v nvidia-smi 2>/dev/null)
ifeq ($(TORCH_INDEX),auto)
  ifeq ($(shell uname -s)$(NVIDIA),Linux)
    TORCH_FROM := $(TORCH_CPU_INDEX)
    FALLBACK := yes
    TORCH_WHY := Linux with no NVIDIA GPU (no /proc/driver/nvidia, no nvidia-smi): the CPU wheel
  else
    TORCH_WHY := $(if $(NVIDIA),an NVIDIA GPU ($(NVIDIA)): the default index's CUDA build,not Linux: the default index's wheel)
  endif
else ifeq ($(TORCH_INDEX),cpu)
  TORCH_FROM := $(TORCH_CPU_INDEX)
  TORCH_WHY := TORCH_INDEX=cpu (no fallback: you asked for this index)
else ifeq ($(TORCH_INDEX),default)
  TORCH_WHY := TORCH_INDEX=default
else ifneq ($(filter http://% https://% file:%,$(TORCH_INDEX)),)
  TORCH_FROM := $(TORCH_INDEX)
  TORCH_WHY := TORCH_INDEX=$(TORCH_INDEX) (no fallback: you asked for this index)
else
  $(error TORCH_INDEX=$(TORCH_INDEX) is not auto, cpu, default or an index URL (e.g. https://download.pytorch.org/whl/cu130))
endif

STAMP := .install-stamps/$(subst /,_,$(abspath $(PY)))
PIP = $(PY) -m pip install
PIP_FAILED = { echo "install: error: pip failed (its message is above). A system Python may refuse installs \
(PEP 668, externally managed): leave PY= out to use the project virtualenv." >&2; exit 1; }
ifneq ($(call given,TORCH)$(call given,TORCH_INDEX)$(call given,TORCH_CPU_INDEX)$(call given,TORCH_PROBE_TIMEOUT),)
  ifeq ($(FORCE)$(shell test -f '$(STAMP)' -a '$(STAMP)' -nt pyproject.toml && echo fresh),fresh)
    $(info make: TORCH* settings ignored: the install is up to date (FORCE=1 reinstalls with them))
  endif
endif

.PHONY: install demo test test-lessons test-deep chain gpu-test bench serve clean-venv force-install

install: $(STAMP)

$(STAMP): pyproject.toml $(if $(FORCE),force-install) | $(NEED_VENV)
	@command -v "$(PY)" >/dev/null 2>&1 || { echo "make: error: $(PY) not found ($(PY_WHY)). Give an existing interpreter: PY=/path/to/python" >&2; exit 1; }
	@$(PY) -c 'import sys; sys.exit(sys.version_info < (3, 10))' || { echo "make: error: $(PY) is older than Python 3.10: BASE_PY=python3.11 or PY=..." >&2; exit 1; }
	@echo "install: into $(PY), $(PY_WHY)"
	@echo "install: $(TORCH) from $(or $(TORCH_FROM),the default package index); why: $(TORCH_WHY)"
	@if [ -n "$(FALLBACK)" ] && ! $(PY) -c "import urllib.request as u; u.urlopen('$(TORCH_FROM)/torch/', timeout=$(TORCH_PROBE_TIMEOUT))" 2>/dev/null; then \
	  echo "install: $(TORCH_FROM) does not answer within $(TORCH_PROBE_TIMEOUT) s: the default package index instead"; \
	  $(PIP) "$(TORCH)" || $(PIP_FAILED); \
	elif [ -n "$(TORCH_FROM)" ]; then \
	  $(PIP) --index-url "$(TORCH_FROM)" "$(TORCH)" || { [ -n "$(FALLBACK)" ] && \
	    echo "install: pip failed against $(TORCH_FROM): the default package index instead" && $(PIP) "$(TORCH)"; } || $(PIP_FAILED); \
	else \
	  $(PIP) "$(TORCH)" || $(PIP_FAILED); \
	fi
	@echo 'install: this package and its test extra: pip install -e ".[test]"'
	@$(PIP) -e ".[test]" || $(PIP_FAILED)
	@mkdir -p .install-stamps && touch "$@"
	@echo "install: done; the next make skips this until pyproject.toml changes (FORCE=1 reinstalls)"

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
	$(PY) -m pytest $(XDIST) -m "not lessons and not deep" $(PYTEST_ARGS)

test-lessons: install
	$(PY) -m pytest $(XDIST) -m lessons $(PYTEST_ARGS)

test-deep: install
	$(PY) -m pytest $(XDIST) -m "deep or fuzz" --hypothesis-profile=deep $(PYTEST_ARGS)

chain: install
	$(PY) scripts/check_chain.py

gpu-test: install
	$(PY) -m pytest -m gpu -n $(GPU_TEST_JOBS) --dist load $(PYTEST_ARGS)

# A GPU benchmark (docs/benchmarks.md lists them all); a GPU run writes benchmarks/results/bench_attention/.
bench: install
	$(PY) -m benchmarks.bench_attention

# Stage 10's OpenAI-compatible server, on the built-in tiny model unless SERVE_ARGS names one:
#   make serve SERVE_ARGS="--model PATH --port 8001"      (python -m l10_server --help lists the flags)
serve: install
	$(PY) -m l10_server $(SERVE_ARGS)

# Removes the project virtualenv and the install stamps; the next make demo/test starts from scratch.
clean-venv:
	rm -rf "$(VENV)" .install-stamps
