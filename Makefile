# Every target creates its own virtual environment first, so a fresh machine needs only python3.11 and make.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: venv test lint typecheck pytest run clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: venv
	$(BIN)/mypy

pytest: venv
	$(BIN)/pytest -q

test: lint typecheck pytest

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache
