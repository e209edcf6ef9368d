# Set-up and test commands (the README's two commands use these).
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: setup prometheus chromium test demo bench docs

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# torch==2.13.0 first: a loose torch requirement with nothing installed pulls a multi-GB CUDA build.
# numpy beside it: torch's CPU wheel does not require it, and warns "Failed to initialize
# NumPy" on every import without it.
setup: $(BIN)/python
	$(BIN)/pip install -q torch==2.13.0 numpy
	$(BIN)/pip install -q -e '.[dev]'

# The real Prometheus server and promtool (Debian's package) for the end-to-end tests.
prometheus:
	@command -v prometheus >/dev/null && command -v promtool >/dev/null || \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus >/dev/null; }

# A real headless Chromium (Debian's package) for the report test.
chromium:
	@command -v chromium >/dev/null || \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }

# One worker per core, at most 4, each test file on one worker (its module fixtures, such as
# a Prometheus server, start once). `pytest -q` alone runs the same tests one at a time.
test: setup prometheus chromium
	$(BIN)/python -m pytest -q -n auto --maxprocesses 4 --dist loadfile --durations=20

demo: setup
	$(BIN)/otel-train demo

bench: setup
	$(BIN)/python benchmarks/bench_hot_path.py
	$(BIN)/python benchmarks/bench_disabled.py
	$(BIN)/python benchmarks/bench_processors.py
	$(BIN)/python benchmarks/bench_collector_down.py
	$(BIN)/python benchmarks/bench_hooks.py
	$(BIN)/python benchmarks/bench_shutdown.py --skip-sdk
	$(BIN)/python benchmarks/bench_report.py
	$(BIN)/python benchmarks/bench_comm_hook.py

# docs/options.md is generated from RunOptions (tests/common/test_options_doc.py checks it).
docs:
	$(BIN)/python -m otel_train.common.options_doc > docs/options.md
