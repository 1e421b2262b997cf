# One command runs every check: `make check` (format, lint, types, stage boundaries, tests incl. promtool).
# `make test` is the README's test command; `make e2e` adds the real-vLLM end-to-end tests.
PY ?= .venv/bin/python
VENV ?= .venv

.PHONY: venv check fmt lint types boundaries test test-busy e2e bench contract

venv:
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q -e '.[dev]'

fmt:
	$(PY) -m ruff format --check kvwatch tests benchmarks

lint:
	$(PY) -m ruff check kvwatch tests benchmarks

types:
	$(PY) -m mypy

# docs/architecture.md's rule (a stage never imports a later one) as import-linter contracts in
# pyproject.toml [tool.importlinter].
boundaries:
	$(VENV)/bin/lint-imports

test:
	$(PY) -m pytest -q

# The same tests on a busy machine: stress-ng keeps one worker spinning on every core throughout.
test-busy:
	stress-ng --cpu 0 --quiet & load=$$!; \
	$(PY) -m pytest -q; rc=$$?; kill $$load; wait $$load; exit $$rc

e2e:
	KVWATCH_RUN_VLLM=1 $(PY) -m pytest -q tests/e2e

contract:
	python3 ../shared/tools/check_contract.py --kvwatch "$(VENV)/bin/kvwatch"

bench:
	$(PY) benchmarks/analyze_speed.py
	$(PY) benchmarks/footprint.py

check: fmt lint types boundaries test
