# The README's commands. Each target sets up the virtual environment first when needed.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# NeMo's environment, the one a trainer has: see nemo-env below.
NEMO_VENV := .venv-nemo
NEMO_STAMP := $(NEMO_VENV)/.installed
export DAGSTER_HOME ?= $(CURDIR)/.dagster_home
export DATA_ROOT ?= $(CURDIR)/.data
PORT ?= 3000
# The checkout's Python packages (the suite's interpreters import them from here).
CHECKOUT_PACKAGES := speechdata assets resources sensors dagster_project benchmarks tests
# The instance dagster.yaml: deploy/local (SQLite in DAGSTER_HOME) or deploy/production (PostgreSQL,
# connection from DAGSTER_POSTGRES_*).
DAGSTER_INSTANCE ?= local

.PHONY: setup nemo-env demo dev lint check test test-fast docs bench clean instance postgres-server ffmpeg-libs

setup: ffmpeg-libs $(STAMP)

# torchcodec (datasets' Audio decoding) loads FFmpeg's shared libraries; Debian's 5.1 ones work.
ffmpeg-libs:
	@ldconfig -p | grep -q 'libavcodec\.so' || { \
	  SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq \
	    libavcodec59 libavformat59 libavutil57 libswresample4 libswscale6 libavfilter8 libavdevice59; }

$(STAMP): pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "need $(PYTHON) (pyenv, apt or python.org)"; exit 1; }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip uv
	# uv resolves and installs the ~6 GB ML stack in a fraction of pip's time. --compile-bytecode writes
	# every module's .pyc now: where PYTHONDONTWRITEBYTECODE is set no import writes one, and each new
	# interpreter (a run worker, a benchmark's child, a test's subprocess) compiled torch, transformers
	# and Dagster from source again, seconds of CPU each (docs/testing.md, "Bytecode compiled once").
	$(BIN)/uv pip install --compile-bytecode --python $(BIN)/python -e '.[platform,dev]'
	touch $(STAMP)

# The consumers' environment: the core library and nemo_toolkit[asr] with the same torch pins (the
# nemo-consumer dependency group in pyproject.toml). The tests that check NeMo's own loaders read our
# exports, and the NeMo Viterbi reference, run their NeMo part in it (tests/nemo_env.py). NeMo cannot
# join .venv: its hydra-core / omegaconf pin antlr4 4.9, and Dagster's selection grammar needs 4.13.
nemo-env: $(NEMO_STAMP)

$(NEMO_STAMP): pyproject.toml | $(STAMP)
	test -x $(NEMO_VENV)/bin/python || $(PYTHON) -m venv $(NEMO_VENV)
	$(BIN)/uv pip install --compile-bytecode --python $(NEMO_VENV)/bin/python -e . --group pyproject.toml:nemo-consumer
	touch $(NEMO_STAMP)

# Copied every time, so that switching DAGSTER_INSTANCE takes effect.
instance:
	mkdir -p $(DAGSTER_HOME)
	cp deploy/$(DAGSTER_INSTANCE)/dagster.yaml $(DAGSTER_HOME)/dagster.yaml

# The e2e test starts its own PostgreSQL server for the instance: Debian's server binaries.
postgres-server:
	@ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1 || { \
	  SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq postgresql; }

demo: setup instance
	$(BIN)/python -m dagster_project.demo

# The demo's profile (small): the UI shows the demo's runs under the code versions that built them (with
# tiny, every alignment read as changed code) and aligns new shards with the same trained aligner.
# exec: the recipe's shell becomes dagster dev, so the SIGTERM or SIGINT that make passes on reaches it
# and it stops its daemon, webserver and code servers; a shell in between would die alone and leave them.
dev: setup instance
	$(BIN)/dagster instance concurrency set gpu 1
	export SPEECHDATA_PROFILE=$${SPEECHDATA_PROFILE:-small}; exec $(BIN)/dagster dev -w workspace.yaml -p $(PORT)

# The browser test drives Debian's Chromium (never a downloaded browser); CI has Debian's registry.
CHROMIUM := /usr/bin/chromium
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

$(CHROMIUM):
	@command -v apt-get >/dev/null || { echo "need $(CHROMIUM): install Debian's chromium package"; exit 1; }
	$(SUDO) apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq chromium chromium-driver

# Format, lint (isort included) and the import contracts in pyproject.toml; make test runs it first.
lint: setup
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .
	$(BIN)/lint-imports

# The contracts in docs/ as a site in site/ (mkdocs, material theme); --strict fails on a broken link.
docs: setup
	$(BIN)/uv pip install --python $(BIN)/python -e '.[platform,dev,docs]'
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

# The inner loop, under 2 minutes: lint, then the unit tests but those marked slow (a new interpreter
# each: Dagster's CLI, NeMo in .venv-nemo). PYTHONPATH (lint-imports too): this checkout's packages,
# not the installed ones.
check: export PYTHONPATH := $(CURDIR)
check: lint
	SPEECHDATA_PROFILE=tiny $(BIN)/python -m pytest -q -p no:cacheprovider -m "not slow" tests/unit

# Everything: lint, Chromium and PostgreSQL for the e2e tests, then the whole suite. compileall first:
# the checkout's own .pyc, which no import writes under PYTHONDONTWRITEBYTECODE (under a second, and
# each interpreter the suite starts then reads them instead of compiling; docs/testing.md).
test: setup nemo-env lint $(CHROMIUM) postgres-server
	$(BIN)/python -m compileall -q $(CHECKOUT_PACKAGES)
	SPEECHDATA_PROFILE=tiny $(BIN)/python -m pytest -n 2 --dist loadfile --durations=25 tests

# The whole suite but the benchmark smoke tests (marker bench) and the e2e tests (marker e2e: a real
# dagster dev, Chromium, PostgreSQL): the check before pushing when no browser or server is at hand.
test-fast: setup nemo-env lint
	$(BIN)/python -m compileall -q $(CHECKOUT_PACKAGES)
	SPEECHDATA_PROFILE=tiny $(BIN)/python -m pytest -n 2 --dist loadfile -m "not bench and not e2e" tests

bench: setup nemo-env
	SPEECHDATA_PROFILE=tiny $(BIN)/python -m benchmarks.run_all

clean:
	rm -rf .data .dagster_home .pytest_cache
