# Two commands: `make run` (set up and start the gateway) and `make test` (set up and run every test).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
TEST_DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/test
PYTEST_ARGS ?=

.PHONY: run install install-dev migrate test test-sqlite test-postgres lint format superuser clean

$(VENV)/.installed: requirements.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -r requirements.txt
	touch $@

$(VENV)/.installed-dev: requirements.txt requirements-dev.txt $(VENV)/.installed
	$(PIP) install -q -r requirements-dev.txt
	touch $@

install: $(VENV)/.installed

install-dev: $(VENV)/.installed-dev

migrate: install
	$(PY) manage.py migrate --noinput

## Set up (venv, install, migrate) and serve on $HOST:$PORT (default 127.0.0.1:8000).
run: migrate
	$(PY) manage.py serve

superuser: migrate
	$(PY) manage.py createsuperuser

lint: install-dev
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

format: install-dev
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

test-sqlite: install-dev
	env -u DATABASE_URL -u REDIS_URL -u LLM_API_BASE $(PY) -m pytest $(PYTEST_ARGS)

test-postgres: install-dev
	env -u REDIS_URL -u LLM_API_BASE DATABASE_URL=$(TEST_DATABASE_URL) $(PY) -m pytest $(PYTEST_ARGS)

## Set up and run the whole suite: lint, then every test on SQLite and on PostgreSQL.
test: lint test-sqlite test-postgres

clean:
	rm -rf $(VENV) var
