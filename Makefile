# PrefixGate developer tasks. Every target sets up .venv first.
# The interpreter .venv is built from: tools/pick_python.py prefers the distribution's CPython
# (built with PGO + LTO; 8-17 % less gateway CPU per request than pyenv's default build,
# docs/benchmarks.md "End of the 2026-12-03 session 19"). Override: `make PY=/path/to/python3`
# or PREFIXGATE_PYTHON=... (taken as given); an existing .venv keeps its interpreter
# (`rm -rf .venv` to rebuild).
PY ?= $(or $(PREFIXGATE_PYTHON),$(shell python3 tools/pick_python.py 2>/dev/null || echo python3))
VENV := .venv
BIN := $(VENV)/bin
OPA_BINDINGS := opa-golib-python-bindings==0.4.4

.PHONY: setup setup-bench system-deps demo test bench clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --upgrade pip

# Install the project with its dev extras, plus the embedded OPA engine,
# which declares Python 3.14 but runs on 3.11 (see pyproject.toml). The stamp
# files make a repeated `make demo` / `make test` skip the install unless
# pyproject.toml changed (the install is editable: code changes need none).
STAMP := $(VENV)/.setup-stamp
BENCH_STAMP := $(VENV)/.setup-bench-stamp

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install -e '.[dev]'
	$(BIN)/pip install --ignore-requires-python $(OPA_BINDINGS)
	touch $@

$(BENCH_STAMP): pyproject.toml $(STAMP)
	$(BIN)/pip install -e '.[dev,bench]'
	touch $@

setup: $(STAMP)

setup-bench: $(BENCH_STAMP)

# System packages the tests need (a real syslog receiver, a real Redis for the
# shared-state tests of issue 16). Needs root.
system-deps:
	@command -v rsyslogd >/dev/null 2>&1 || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq rsyslog >/dev/null)
	@command -v redis-server >/dev/null 2>&1 || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null)

# The main job: simulated replicas + gateway + real-trace replay, one run per routing policy.
# Writes results/demo.{md,json} (git-ignored).
demo: setup
	$(BIN)/prefixgate-sim demo

test: setup system-deps
	$(BIN)/python -m pytest

# Side-by-side benchmark with SGLang's router (not part of the tests).
bench: setup-bench
	$(BIN)/python -m sim.bench

clean:
	rm -rf $(VENV) build *.egg-info
