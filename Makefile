# framejit: `make demo` and `make test` do all set-up on a fresh machine (idempotent, fast when
# nothing changed).

PYTHON311 ?= $(shell command -v python3.11 2>/dev/null || echo python3)
VENV      := .venv
PY        := $(VENV)/bin/python
PIP       := $(PY) -m pip --disable-pip-version-check -q
# The CPU wheel of torch 2.13.0 is local on the project machines; any other version pulls CUDA.
TORCH_PIN := torch==2.13.0
DEPS      := $(VENV)/.deps-stamp
EXT       := $(VENV)/.ext-stamp

.PHONY: setup demo test test-py test-hook bench lint clean fuzz

setup: $(EXT)

$(DEPS): pyproject.toml Makefile
	@test -x $(PY) || $(PYTHON311) -m venv $(VENV)
	$(PIP) install --upgrade pip setuptools wheel
	$(PIP) install $(TORCH_PIN)
	$(PIP) install numpy "bytecode>=0.15" networkx triton pytest ruff transformers
	@touch $@

# Rebuilds the C extension (editable install) whenever its source changes.
$(EXT): $(DEPS) csrc/eval_frame.c
	$(PIP) install --no-build-isolation --no-deps -e '.[test]'
	@touch $@

demo: setup
	$(PY) examples/demo.py

test: setup test-hook test-py

test-py:
	$(PY) -m pytest tests --ignore=tests/hook

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
