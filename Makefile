# lakemirror: the two commands of the README are `make demo` and `make test`.
# Each installs what it needs first (scripts/setup.sh is idempotent and quick once done).
VENV := .venv/bin
# pytest keeps its rewritten test modules beside them (__pycache__/), also where the shell sets
# PYTHONDONTWRITEBYTECODE: otherwise every run and every worker rewrites every test module again.
PYTEST := PYTHONDONTWRITEBYTECODE= $(VENV)/python -m pytest

.PHONY: setup demo run test test-all typecheck test-unit test-integration test-e2e torture bench clean

setup:
	@scripts/setup.sh

# PORT=…: the port of the demo's status page and /metrics (default 9464; 0: any free port).
demo: setup
	$(VENV)/lakemirror demo $(if $(PORT),--port $(PORT),)

run: setup
	$(VENV)/lakemirror run $(CONFIG)

# The README's test command: typecheck, unit, integration and the smoke of every real part and crash
# mechanism. `make test-all` adds the tests marked slow (the full crash tortures, the long scenarios).
# These and the single tiers run on WORKERS pytest processes (default 2; WORKERS=0: one process), each
# taking a test module whole, or every test of one service (tests/conftest.py: worker_group).
WORKERS ?= 2
PARALLEL := $(if $(filter-out 0,$(WORKERS)),-n $(WORKERS) --dist loadgroup,)

test: setup typecheck
	$(PYTEST) tests -m "not slow" $(PARALLEL) --durations=25 $(PYTEST_ARGS)

test-all: setup typecheck
	$(PYTEST) tests $(PARALLEL) --durations=25 $(PYTEST_ARGS)

# mypy --strict over the packages that pass it (scripts/typecheck.sh names them).
typecheck: setup
	scripts/typecheck.sh

test-unit: setup
	$(PYTEST) tests/unit $(PARALLEL)

test-integration: setup
	$(PYTEST) tests/integration $(PARALLEL)

test-e2e: setup
	$(PYTEST) tests/e2e $(PARALLEL)

# The full crash-torture run (>= 25 SIGKILLs); writes docs/RELIABILITY.md. KILLS=n to change; DV=1: replicas
# with deletion vectors on, written to docs/RELIABILITY_DELETION_VECTORS.md.
torture: setup
	$(VENV)/python scripts/torture.py --kills $(or $(KILLS),25) $(if $(DV),--deletion-vectors,)

# lakemirror against its baselines (delta-rs CDF loop, full refresh, copy floor); docs/BENCHMARKS.md.
# QUICK=1: a smoke run. ONLY=steady,scale,...: rerun some workloads, keep the other figures (ONLY=production:
# on a local S3 server, the user's recipe, lakemirror's S3 driver, Spark-only and Connect paths and the delta-rs
# loop, sources written by delta-rs and by Spark; ONLY=soak: one lakemirror path for an hour, not in the default
# run). ARGS=...: more options of `python -m bench` (e.g. ARGS="--rows recipe,spark --writers spark --tables 4").
bench: setup
	$(VENV)/python -m pip install --quiet -e '.[bench]'
	$(VENV)/python -m bench $(if $(QUICK),--quick,) $(if $(ONLY),--only $(ONLY),) $(ARGS)

clean:
	rm -rf .lakemirror-demo .pytest_cache build dist *.egg-info
