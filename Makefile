# The contributor's loops (CONTRIBUTING.md).  `make test` is the fast one: no apt, no vLLM, no
# browser, no Prometheus server; `make test-all` is the README's test command (everything CI runs).
PYTHON ?= python
PYTEST_FAST = -m "not vllm and not slow" --deselect tests/dashboards/test_browser.py

.PHONY: help install test test-all lint format typecheck docs docs-check deps-bounds bench

help:  ## this list
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-10s %s\n", $$1, $$2}'

install:  ## the dev environment without vLLM (enough for `make test`)
	$(PYTHON) -m pip install -e '.[dev]'

test:  ## the fast loop: every test that needs neither vLLM nor system packages
	$(PYTHON) -m pytest $(PYTEST_FAST) $(ARGS)

test-all:  ## the README's test command: system packages, vLLM's CPU build, the whole suite
	bash scripts/test.sh $(ARGS)

lint:  ## ruff (lint and format check) and the type check, as CI runs them
	ruff check .
	ruff format --check .
	mypy

format:  ## rewrite the tree in the house format
	ruff check --fix .
	ruff format .

typecheck:  ## mypy over the core packages ([tool.mypy] in pyproject.toml)
	mypy

docs:  ## regenerate the generated docs (span contract, metrics, views, settings)
	$(PYTHON) scripts/gen_docs.py

docs-check:  ## fail when a generated doc is out of date
	$(PYTHON) scripts/gen_docs.py --check

deps-bounds:  ## the fast tests against the oldest and the newest dependency versions allowed
	bash scripts/deps_bounds.sh

bench:  ## the benchmarks' quick runs (docs/benchmarks.md has the full commands)
	$(PYTHON) benchmarks/store/bench_store.py --quick
	$(PYTHON) benchmarks/connector/bench_connector.py --quick
