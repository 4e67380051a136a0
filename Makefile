# Hare: the commands a newcomer types. Each target sets up its own environment.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test test-fallback test-workers compile uncompile lint bench bench-spark pipeline cluster nemesis clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/hare-server --data-dir ./data

# The suite in TEST_PROCS processes (pytest-xdist): a file's tests in one process, the heavy
# tests (tests/conftest.py, HEAVY) one after another in one process, started first.
# TEST_PROCS=0 runs it in this one process. Its brokers are single processes (tests/conftest.py
# sets HARE_WORKERS=1 unless the environment names a count; test-workers below runs two).
TEST_PROCS ?= 4
PYTEST := $(BIN)/python -m pytest -q -rs -n $(TEST_PROCS) --dist loadgroup

test: $(STAMP)
	$(PYTEST)

# The hot modules (broker/compiled.py's MODULES) compiled with mypyc beside their sources:
# needs a C compiler and Python's headers (Debian: gcc, python3-dev). Without a build the .py
# files run, with the same behaviour; a source edited after the build runs as .py (with a
# warning) until the next `make compile`; `make uncompile` removes the build.
compile: $(STAMP)
	$(BIN)/python mypyc_build.py

uncompile:
	$(PY) mypyc_build.py --clean

# CI, after `make test` on the compiled build: the suite again on the .py sources
# (HARE_PURE_PYTHON; tests/test_compiled.py checks which ran) with every broker the tests start
# run as a parent and two worker processes (HARE_WORKERS=2), so the fallback and the second
# worker count are covered in one run. tests/cluster is left out: it starts its own topologies
# (a 2-worker server on etcd is tests/cluster/test_server_workers.py) and ignores HARE_WORKERS,
# so `make test` has run it already. Tests that pin --workers keep theirs.
WORKERS_TESTS := tests --ignore=tests/cluster
test-workers: $(STAMP)
	HARE_PURE_PYTHON=1 HARE_TEST_EXPECT_BUILD=python HARE_WORKERS=2 \
	    $(PYTEST) $(WORKERS_TESTS)

# For local use, quicker than test-workers: the tests that exercise the compiled modules, on
# their .py sources, one process per broker
FALLBACK_TESTS := tests/test_compiled.py tests/protocol tests/flow tests/queue tests/routing \
	tests/server
test-fallback: $(STAMP)
	HARE_PURE_PYTHON=1 HARE_TEST_EXPECT_BUILD=python $(PYTEST) $(FALLBACK_TESTS)

# ruff everywhere; mypy over the packages of pyproject.toml's [tool.mypy] (the queue-type
# contract, broker/queue/contract.py, is what it holds)
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy

# Starts a Hare of its own on port 5673 (fresh data dir) and runs every hare-perf scenario
# against it; a RabbitMQ answering on 5672 is measured first, so ratios read Hare/RabbitMQ.
# BENCH_ARGS passes options to the suite, e.g. BENCH_ARGS="--runs 5 --out bench.json".
BENCH_DIR ?= /tmp/hare-bench
bench: $(STAMP)
	@rm -rf $(BENCH_DIR); mkdir -p $(BENCH_DIR); \
	$(BIN)/hare-server --port 5673 --data-dir $(BENCH_DIR)/data --management-port 0 \
	    --log-level warning > $(BENCH_DIR)/hare.out 2> $(BENCH_DIR)/hare.log & hare=$$!; \
	for i in $$(seq 100); do grep -q listening $(BENCH_DIR)/hare.out && break; sleep 0.1; done; \
	urls="--url amqp://guest:guest@127.0.0.1:5673/ --pid $$hare"; \
	if (exec 3<>/dev/tcp/127.0.0.1/5672) 2>/dev/null; then \
	    rabbit=$$(pgrep -x beam.smp | head -1); \
	    urls="--url amqp://guest:guest@127.0.0.1:5672/ $${rabbit:+--pid $$rabbit} $$urls"; \
	fi; \
	$(BIN)/python -m hare_perf.suite $$urls $(BENCH_ARGS); status=$$?; \
	kill $$hare; wait $$hare; exit $$status

# The Spark connector beside plain pika clients, on a Hare of its own (free port, fresh data).
bench-spark: $(STAMP)
	@rm -rf $(BENCH_DIR)-spark; mkdir -p $(BENCH_DIR)-spark; \
	$(BIN)/hare-server --port 0 --data-dir $(BENCH_DIR)-spark/data --management-port 0 \
	    --log-level warning > $(BENCH_DIR)-spark/hare.out 2> $(BENCH_DIR)-spark/hare.log & hare=$$!; \
	for i in $$(seq 100); do grep -q listening $(BENCH_DIR)-spark/hare.out && break; sleep 0.1; done; \
	port=$$(sed -n 's/.*listening on port //p' $(BENCH_DIR)-spark/hare.out | head -1); \
	$(BIN)/python -m hare_bench.bench_spark --url amqp://guest:guest@127.0.0.1:$$port/ \
	    $(BENCH_ARGS); status=$$?; kill $$hare; wait $$hare; exit $$status

# The example pipeline: Hare -> Spark Structured Streaming -> Parquet and Hare -> hare-store.
# PIPELINE_ARGS="--url amqp://... --data-dir DIR" uses a broker of yours instead.
pipeline: $(STAMP)
	$(BIN)/python examples/pipeline.py $(PIPELINE_ARGS)

# etcd and NODES Hare nodes on this machine (docs/CLUSTER.md): hare-1 on PORT, hare-2 on
# PORT+1, ...; management on 10000+PORT+i, etcd on PORT-1. Ctrl-C stops them.
# 5672 is RabbitMQ's here: `make cluster NODES=2 PORT=5700`.
NODES ?= 3
PORT ?= 5672
cluster: $(STAMP)
	$(BIN)/python -m hare_bench.local_cluster --nodes $(NODES) --port $(PORT)

# Quorum queues under a nemesis (docs/CLUSTER.md): three nodes and a private etcd, clients on
# each, nodes killed, restarted and paused at random for NEMESIS_S seconds; prints the actions
# and lost / duplicated / reordered counts (exit 1 if anything confirmed was lost).
NEMESIS_S ?= 600
nemesis: $(STAMP)
	$(BIN)/python -m tests.cluster.nemesis --seconds $(NEMESIS_S)

clean:
	rm -rf $(VENV) data .pytest_cache
