# malleable: developer entry points. `make test` and `make demo` work on a fresh
# Debian 12 machine as root; everything is installed into .venv under the repo.

# Debian's own Python, so that non-root users (tests of operator permissions) can run
# the venv too; any Python >= 3.11 works otherwise: make PYTHON=python3.12 test
PYTHON ?= $(shell test -x /usr/bin/python3 && echo /usr/bin/python3 || echo python3)
VENV ?= .venv
BIN := $(VENV)/bin
EXTRAS ?= dev,examples
PYTEST_ARGS ?=

.PHONY: install test lint demo clean

$(BIN)/.installed: pyproject.toml setup.py
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || \
		{ echo "error: $(PYTHON) is older than Python 3.11" >&2; exit 2; }
	@$(PYTHON) -m venv $(VENV) 2>/dev/null || { \
		echo "installing python3-venv (Debian)"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv && \
		$(PYTHON) -m venv $(VENV); }
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e ".[$(EXTRAS)]"
	@touch $@

install: $(BIN)/.installed

# The tests bring up what they need themselves: the Slurm harness (tests/conftest.py)
# and, for tests marked postgres, a private PostgreSQL server.
test: install
	$(BIN)/python -m pytest $(PYTEST_ARGS)

lint: install
	$(BIN)/ruff check malleable tests scripts/slurm-harness scripts/demo.py benchmarks

# Two local Slurm clusters, the default policy against plain Slurm on the same replayed
# workload, about 12 minutes; report in demo-report/. DEMO_ARGS=--short: the CI form.
DEMO_ARGS ?=
demo: install
	$(BIN)/python scripts/demo.py $(DEMO_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache .hypothesis demo-report
