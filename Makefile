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

.PHONY: setup demo test test-py test-hook test-fx bench lint clean

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

test: setup test-hook test-py test-fx

test-py:
	$(PY) -m pytest tests --ignore=tests/hook

# The capture, model and API tests again with every graph of backend="default"/"eager" exported to
# torch.fx and run by torch.fx's generated code (tests/conftest.py, framejit.testing).
test-fx:
	@echo "==== tests/capture tests/models tests/api through the torch.fx export (FRAMEJIT_TEST_BACKEND=fx) ===="
	FRAMEJIT_TEST_BACKEND=fx $(PY) -m pytest tests/capture tests/models tests/api

# The hook's own tests need no torch and run on every CPython 3.11+ that pyenv has.
test-hook:
	bash tools/hook_tests.sh

bench: setup
	$(PY) benchmarks/overhead.py

lint: setup
	$(PY) -m ruff check framejit tests benchmarks

clean:
	rm -rf build $(VENV) .venv-py3* framejit/*.so *.egg-info
