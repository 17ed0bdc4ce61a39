# framejit: `make demo` and `make test` do all set-up on a fresh machine (idempotent, fast when
# nothing changed).

PYTHON311 ?= $(shell command -v python3.11 2>/dev/null || echo python3)
VENV      := .venv
PY        := $(VENV)/bin/python
PIP       := $(PY) -m pip --disable-pip-version-check -q
# The CPU wheel of torch 2.13.0 is local on the project machines; any other version pulls CUDA.
TORCH_PIN := torch==2.13.0
# The model tests hold transformers' forwards to one graph each: a new release can change its
# Python (5.24 gave ModelOutput a metaclass), so the tests run on the version last checked.
TRANSFORMERS_PIN := transformers==5.24.0
DEPS      := $(VENV)/.deps-stamp
EXT       := $(VENV)/.ext-stamp

# CPython 3.12 (what the GPU machine runs): the newest pyenv 3.12, else python3.12 on PATH, found
# as tools/hook_tests.sh finds it. Its venv is shared with the hook tests, which create it with
# pytest only when it is missing; the stamps below then add torch and the rest. For 3.12, torch
# 2.13.0 is the registry's CUDA build (about 5 GB, runs on the CPU).
ifeq ($(origin PYTHON312),undefined)
PYTHON312 := $(shell bash tools/find_python.sh 3.12)
endif
export PYTHON312
VENV312   := .venv-py312
PY312     := $(VENV312)/bin/python
PIP312    := $(PY312) -m pip --disable-pip-version-check -q
DEPS312   := $(VENV312)/.deps-stamp
EXT312    := $(VENV312)/.ext-stamp

.PHONY: setup setup312 browser demo test test-py test-hook test-fx test-gpu bench lint clean fuzz fuzz-kernels

setup: $(EXT)

$(DEPS): pyproject.toml Makefile
	@test -x $(PY) || $(PYTHON311) -m venv $(VENV)
	$(PIP) install --upgrade pip setuptools wheel
	$(PIP) install $(TORCH_PIN)
	$(PIP) install numpy "bytecode>=0.15" networkx triton pytest ruff $(TRANSFORMERS_PIN)
	@touch $@

# Rebuilds the C extension (editable install) whenever its source changes. Each venv builds its
# own framejit/_C.cpython-3XX-*.so in place; the two live side by side.
$(EXT): $(DEPS) csrc/eval_frame.c csrc/claunch.c
	$(PIP) install --no-build-isolation --no-deps -e '.[test]'
	@touch $@

ifeq ($(PYTHON312),)
setup312:
	@echo "make: no CPython 3.12 found (no \$$PYENV_ROOT/versions/3.12.*, no python3.12 on PATH):" \
	      "the capture and model tests run on 3.11 only"
else
setup312: $(EXT312)

$(DEPS312): pyproject.toml Makefile
	@test -x $(PY312) || $(PYTHON312) -m venv $(VENV312)
	$(PIP312) install --upgrade pip setuptools wheel
	$(PIP312) install $(TORCH_PIN)
	$(PIP312) install numpy "bytecode>=0.15" networkx pytest $(TRANSFORMERS_PIN)
	@touch $@

# After the 3.11 build: the two editable installs would write framejit.egg-info at once.
$(EXT312): $(DEPS312) $(EXT) csrc/eval_frame.c csrc/claunch.c
	$(PIP312) install --no-build-isolation --no-deps -e '.[test]'
	@touch $@
endif

# The HTML report's browser test (tests/debug/test_report.py) opens the page in Debian's
# chromium: installed here once, as root or through sudo, where apt-get exists. Never fails the
# build: without chromium that one test is skipped, and this says so.
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	    if command -v apt-get >/dev/null 2>&1; then \
	        if [ "$$(id -u)" = 0 ]; then SUDO=; elif command -v sudo >/dev/null 2>&1; then SUDO="sudo -n"; else SUDO=none; fi; \
	        if [ "$$SUDO" != none ]; then \
	            echo "make: installing chromium (apt-get) for the HTML report's browser test"; \
	            $$SUDO apt-get install -y -q chromium >/dev/null 2>&1 || \
	            { $$SUDO apt-get update -q >/dev/null 2>&1 && $$SUDO apt-get install -y -q chromium >/dev/null 2>&1; } || true; \
	        fi; \
	    fi; \
	    command -v chromium >/dev/null 2>&1 || \
	        echo "make: no chromium (apt-get unavailable or not allowed): the HTML report's browser test is skipped"; \
	}

demo: setup
	$(PY) examples/demo.py

# The set-up (the two venvs' downloads side by side: 3.12's torch is 5 GB), the hook tests, then
# the capture and model tests on 3.11 and 3.12 and the torch.fx export run, in two lanes side by
# side (tools/test_py.sh); all of them run even if some fail.
test:
	@$(MAKE) --no-print-directory -j2 setup setup312 browser
	@status=0; \
	$(MAKE) --no-print-directory test-hook || status=1; \
	PY=$(PY) PY312=$(if $(PYTHON312),$(PY312)) FX=1 bash tools/test_py.sh || status=1; \
	exit $$status

# The capture and model tests on 3.11 and on 3.12, side by side (one core each; the 3.12 run's
# output is kept in build/test-py312.log and printed after 3.11's): both always run, each with
# its summary. 3.12 skips the tests that do not depend on the Python version (tools/test_py.sh).
test-py:
	@PY=$(PY) PY312=$(if $(PYTHON312),$(PY312)) bash tools/test_py.sh

# The capture, model and API tests again with every graph of backend="default"/"eager" exported to
# torch.fx and run by torch.fx's generated code (tests/conftest.py, framejit.testing).
test-fx:
	@echo "==== tests/capture tests/models tests/api through the torch.fx export (FRAMEJIT_TEST_BACKEND=fx) ===="
	FRAMEJIT_TEST_BACKEND=fx $(PY) -m pytest tests/capture tests/models tests/api

# On a machine with CUDA: the kernel and backend tests on CUDA tensors compiled for real (every
# marker, slow ones too), then every test marked `gpu`. Without CUDA they all skip. Not part of
# `make test`. On the device machine, tools/gpu_run.sh does the set-up and runs these; there,
# `make test-gpu PY=python3` (after its set-up) skips the .venv set-up (a PY given on the command line
# is used as it is).
test-gpu: $(if $(filter command line,$(origin PY)),,setup)
	@status=0; \
	FRAMEJIT_TEST_GPU=1 $(PY) -m pytest tests/kernels tests/backends -m "" -rfE || status=1; \
	FRAMEJIT_TEST_GPU=1 $(PY) -m pytest tests -m gpu -rfE || status=1; \
	exit $$status

# The hook's own tests need no torch and run on every CPython 3.11+ that pyenv has.
test-hook:
	bash tools/hook_tests.sh

bench: setup
	$(PY) benchmarks/overhead.py

lint: setup
	$(PY) -m ruff check framejit tests benchmarks

clean:
	rm -rf build $(VENV) .venv-py3* framejit/*.so *.egg-info

# The differential fuzzer (tests/fuzz): N generated programs from SEED, eager against compiled, on
# JOBS worker processes; failures are shrunk into $(FUZZ_OUT). `make test` runs a fixed sample.
N         ?= 1000
SEED      ?= 1
JOBS      ?= 2
FUZZ_OUT  ?= build/fuzz-failures

fuzz: setup
	$(PY) -m tests.fuzz.campaign --seed $(SEED) --count $(N) --jobs $(JOBS) --out $(FUZZ_OUT)

# The fused-kernel fuzzer (tests/kernels/pattern_fuzz.py): cases SEED to SEED+N, C kernels against
# the reference interpreter and eager; it prints each failing or differing case.
fuzz-kernels: setup
	$(PY) -m tests.kernels.pattern_fuzz --seeds $(SEED):$$(( $(SEED) + $(N) ))
