# cadence — build, test and benchmark.
#
#   make build   .venv with the pinned dependencies + the extension (maturin develop --release)
#   make run     build, then the main benchmark (cadence vs gloo vs Open MPI, allreduce)
#   make test    build, then cargo test and pytest, then the torch backend's tests
#                again on the oldest supported torch (make test-torch-oldest), then a
#                job started in a venv without torch (make test-no-torch)
#   make bench   build, then every collective at 4 ranks (JSON in bench-results/)
#   make bench-cluster  build, then allreduce/allgather across an emulated 4-host cluster (root)
#   make tune    build, then `cadence tune` with its defaults (writes ~/.cache/cadence/tuning.json)
#   make soak    build, then 30 minutes of random collectives on an emulated cluster under link faults (root)
#   make lint    cargo fmt --check, cargo clippy --all-targets -D warnings, ruff (python, tests, benchmarks)
#   make fuzz    the wire fuzzer's properties with FUZZ_CASES cases each (cargo only)
#   make clean   remove build outputs and .venv (the wheel cache stays)
#
# Python wheels are downloaded once into $(WHEEL_CACHE), outside the checkout and
# keyed by the requirements files, then installed offline from there. A stamp in
# .venv makes a re-run instant; `make build` is a no-op when no source changed.

SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := build

PYTHON ?= python3
MPICC ?= mpicc
VENV := .venv
VBIN := $(CURDIR)/$(VENV)/bin
REQ_HASH := $(shell cat requirements.txt requirements-mpi.txt | sha256sum | cut -d' ' -f1)
WHEEL_CACHE ?= $(HOME)/.cache/cadence/wheels/$(REQ_HASH)
PIP_OFFLINE := $(VBIN)/python -m pip install --quiet --no-index --find-links $(WHEEL_CACHE)
PIP_FILL := $(VBIN)/python -m pip wheel --quiet --no-cache-dir --wheel-dir $(WHEEL_CACHE)

# The extension module that `maturin develop` writes next to the Python sources.
EXT := python/cadence/_core.abi3.so
RUST_SRC := Cargo.toml $(wildcard Cargo.lock) $(shell find crates -type f \( -name '*.rs' -o -name Cargo.toml \) 2>/dev/null)

# Same interpreter for maturin and cargo, so pyo3's build script is not re-run
# (and pyo3 rebuilt) each time one follows the other.
CARGO_ENV := PYO3_PYTHON=$(VBIN)/python
CARGO_TEST_FLAGS ?= --release
PYTEST_TIMEOUT ?= 300

BENCH := $(VBIN)/cadence bench
RUN_ARGS ?= --nranks 4 --op allreduce --dtype float32 -b 8 -e 64M -f 4 -n 50 -w 10 \
	--backends cadence,gloo,mpi
BENCH_OPS ?= allreduce allgather reduce_scatter broadcast alltoall reduce

.PHONY: build run test test-torch-oldest test-no-torch bench bench-cluster tune soak lint fuzz clean clean-cache \
	deps mpi iproute2 chromium

build: $(EXT) $(VENV)/.stamp-mpi $(VENV)/.stamp-iproute2 $(VENV)/.stamp-chromium $(VENV)/.stamp-tools \
	$(VENV)/.stamp-deepspeed $(VENV)/.stamp-ray

# --- Python environment -----------------------------------------------------

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.stamp-deps: requirements.txt | $(VENV)/bin/python
	@if [ ! -f "$(WHEEL_CACHE)/.complete-base" ]; then \
	  echo "make: downloading wheels once into $(WHEEL_CACHE) (torch is large)"; \
	  mkdir -p "$(WHEEL_CACHE)"; \
	  $(PIP_FILL) -r requirements.txt; \
	  touch "$(WHEEL_CACHE)/.complete-base"; \
	fi
	$(PIP_OFFLINE) -r requirements.txt
	touch $@

deps: $(VENV)/.stamp-deps $(VENV)/.stamp-mpi $(VENV)/.stamp-tools $(VENV)/.stamp-deepspeed \
	$(VENV)/.stamp-ray

# $(call pinned_wheels,WHAT,REQUIREMENTS,CACHE,DOWNLOAD FLAGS,INSTALL FLAGS):
# downloads what REQUIREMENTS pins once into CACHE (a folder keyed by the
# file's hash), then installs it offline with --no-deps (each such file lists
# every package it needs beyond the others), and touches the target's stamp.
define pinned_wheels
	@if [ ! -f "$(3)/.complete" ]; then \
	  echo "make: downloading $(1) once into $(3)"; \
	  mkdir -p "$(3)"; \
	  $(VBIN)/python -m pip download --quiet --no-deps $(4) --dest "$(3)" -r $(2); \
	  touch "$(3)/.complete"; \
	fi
	$(VBIN)/python -m pip install --quiet --no-index --no-deps $(5) --find-links "$(3)" -r $(2)
	touch $@
endef

# Reporting tools (matplotlib for `cadence bench --plot`): their own file and
# cache key, so that adding one does not download torch again.
TOOLS_REQ := requirements-tools.txt
TOOLS_CACHE ?= $(HOME)/.cache/cadence/wheels/tools-$(shell sha256sum $(TOOLS_REQ) | cut -d' ' -f1)

$(VENV)/.stamp-tools: $(TOOLS_REQ) $(VENV)/.stamp-deps
	$(call pinned_wheels,the reporting tools,$(TOOLS_REQ),$(TOOLS_CACHE),--only-binary=:all:,)

# DeepSpeed, for its integration test (see requirements-deepspeed.txt: a
# source package, built once against the environment's torch).
DS_REQ := requirements-deepspeed.txt
DS_CACHE ?= $(HOME)/.cache/cadence/wheels/deepspeed-$(shell sha256sum $(DS_REQ) | cut -d' ' -f1)

$(VENV)/.stamp-deepspeed: export DS_BUILD_OPS := 0
$(VENV)/.stamp-deepspeed: $(DS_REQ) $(VENV)/.stamp-tools
	$(call pinned_wheels,DeepSpeed,$(DS_REQ),$(DS_CACHE),--no-binary=deepspeed,--no-build-isolation)

# Ray, for its collective backend's integration test (requirements-ray.txt).
RAY_REQ := requirements-ray.txt
RAY_CACHE ?= $(HOME)/.cache/cadence/wheels/ray-$(shell sha256sum $(RAY_REQ) | cut -d' ' -f1)

$(VENV)/.stamp-ray: $(RAY_REQ) $(VENV)/.stamp-deepspeed
	$(call pinned_wheels,Ray,$(RAY_REQ),$(RAY_CACHE),--only-binary=:all:,)

# Open MPI (apt) and mpi4py, for the `mpi` benchmark backend. Without Open MPI,
# and without root to install it, everything else still builds and tests. No
# stamp is written then, so a later `make build` picks Open MPI up.
$(VENV)/.stamp-mpi: requirements-mpi.txt $(VENV)/.stamp-deps
	@if ! command -v $(MPICC) >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "make: installing Open MPI (apt-get install openmpi-bin libopenmpi-dev)"; \
	    export DEBIAN_FRONTEND=noninteractive; \
	    { apt-get update -qq && apt-get install -y -qq openmpi-bin libopenmpi-dev >/dev/null; } \
	      || echo "make: apt-get could not install Open MPI" >&2; \
	  fi; \
	fi
	@if ! command -v $(MPICC) >/dev/null 2>&1; then \
	  echo "make: Open MPI ($(MPICC)) is not available$$([ "$$(id -u)" = 0 ] || echo ' and this is not root'); skipping mpi4py." >&2; \
	  echo "make: the 'mpi' benchmark backend stays unavailable until someone runs" >&2; \
	  echo "make:   sudo apt-get install openmpi-bin libopenmpi-dev && make build" >&2; \
	  exit 0; \
	fi; \
	if [ ! -f "$(WHEEL_CACHE)/.complete-mpi" ]; then \
	  echo "make: fetching mpi4py into $(WHEEL_CACHE)"; \
	  mkdir -p "$(WHEEL_CACHE)"; \
	  $(PIP_FILL) --no-deps -r requirements-mpi.txt; \
	  touch "$(WHEEL_CACHE)/.complete-mpi"; \
	fi; \
	$(PIP_OFFLINE) --no-deps -r requirements-mpi.txt; \
	touch $@

mpi: $(VENV)/.stamp-mpi

iproute2: $(VENV)/.stamp-iproute2

# iproute2 (apt: ip, tc), for the emulated cluster (`cadence cluster`,
# tests/test_testbed.py). As with Open MPI: installed when missing if we are
# root; otherwise the cluster tests skip, and no stamp is written.
$(VENV)/.stamp-iproute2: | $(VENV)/bin/python
	@if ! command -v ip >/dev/null 2>&1 || ! command -v tc >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "make: installing iproute2 (apt-get install iproute2)"; \
	    export DEBIAN_FRONTEND=noninteractive; \
	    { apt-get update -qq && apt-get install -y -qq iproute2 >/dev/null; } \
	      || echo "make: apt-get could not install iproute2" >&2; \
	  fi; \
	fi
	@if ! command -v ip >/dev/null 2>&1 || ! command -v tc >/dev/null 2>&1; then \
	  echo "make: iproute2 (ip, tc) is not available; the emulated cluster and its tests" >&2; \
	  echo "make:   stay unavailable until someone runs: sudo apt-get install iproute2" >&2; \
	  exit 0; \
	fi; \
	touch $@

chromium: $(VENV)/.stamp-chromium

# Headless Chromium (apt: chromium), in which tests/test_doctor_reports.py
# renders `cadence doctor --html` pages (screenshot, script errors, verdict
# shown). As with iproute2: installed when missing if we are root; otherwise
# those tests skip, and no stamp is written.
$(VENV)/.stamp-chromium: | $(VENV)/bin/python
	@if ! command -v chromium >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "make: installing Chromium (apt-get install chromium)"; \
	    export DEBIAN_FRONTEND=noninteractive; \
	    { apt-get update -qq && apt-get install -y -qq chromium >/dev/null; } \
	      || echo "make: apt-get could not install chromium" >&2; \
	  fi; \
	fi
	@if ! command -v chromium >/dev/null 2>&1; then \
	  echo "make: chromium is not available; the HTML report's browser tests skip until" >&2; \
	  echo "make:   someone runs: sudo apt-get install chromium" >&2; \
	  exit 0; \
	fi; \
	touch $@

# The oldest supported torch (2.6) in its own venv, for test-torch-oldest.
# Same scheme: wheels downloaded once, keyed by the requirements file, then
# installed offline; --no-deps because the file lists every package (it
# leaves out the CUDA libraries that CPU use never loads).
OLDEST := .venv-torch-oldest
OLDEST_REQ := requirements-torch-oldest.txt
OLDEST_CACHE ?= $(HOME)/.cache/cadence/wheels/$(shell sha256sum $(OLDEST_REQ) | cut -d' ' -f1)

$(OLDEST)/.stamp: $(OLDEST_REQ)
	rm -rf $(OLDEST)
	$(PYTHON) -m venv $(OLDEST)
	@if [ ! -f "$(OLDEST_CACHE)/.complete" ]; then \
	  echo "make: downloading the oldest torch once into $(OLDEST_CACHE)"; \
	  mkdir -p "$(OLDEST_CACHE)"; \
	  $(OLDEST)/bin/python -m pip download --quiet --no-deps --only-binary=:all: \
	    --dest "$(OLDEST_CACHE)" -r $(OLDEST_REQ); \
	  touch "$(OLDEST_CACHE)/.complete"; \
	fi
	$(OLDEST)/bin/python -m pip install --quiet --no-index --no-deps \
	  --find-links "$(OLDEST_CACHE)" -r $(OLDEST_REQ)
	touch $@

# A venv with numpy alone (from the wheel cache), where `cadence.init()` must
# start a job without torch: tests/no_torch_job.py, cadence from python/.
NOTORCH := .venv-no-torch

$(NOTORCH)/.stamp: requirements.txt $(VENV)/.stamp-deps
	rm -rf $(NOTORCH)
	$(PYTHON) -m venv $(NOTORCH)
	$(NOTORCH)/bin/python -m pip install --quiet --no-index --find-links $(WHEEL_CACHE) \
	  "$$(grep -E '^numpy==' requirements.txt)"
	touch $@

test-no-torch: $(EXT) $(NOTORCH)/.stamp
	PYTHONPATH=$(CURDIR)/python $(NOTORCH)/bin/python tests/no_torch_job.py

# --- the extension ----------------------------------------------------------

$(EXT): $(RUST_SRC) pyproject.toml $(VENV)/.stamp-deps
	cd $(CURDIR) && VIRTUAL_ENV=$(CURDIR)/$(VENV) PATH=$(VBIN):$$PATH $(CARGO_ENV) \
	  $(VBIN)/maturin develop --release --quiet
	touch $@

# --- the jobs ---------------------------------------------------------------

run: build
	mkdir -p bench-results
	$(BENCH) $(RUN_ARGS) --json bench-results/run.json

test: build
	$(CARGO_ENV) cargo test --workspace $(CARGO_TEST_FLAGS)
	$(VBIN)/pytest -q --timeout=$(PYTEST_TIMEOUT) tests
	# The fault tests again with every link made at set-up (the default makes them on first use).
	CADENCE_CONNECT=eager $(VBIN)/pytest -q --timeout=$(PYTEST_TIMEOUT) tests/test_faults.py
	$(MAKE) --no-print-directory test-torch-oldest
	$(MAKE) --no-print-directory test-no-torch

# The torch backend's and the torch ops' tests on the oldest supported torch, cadence from the
# source tree (the abi3 extension that `make build` put in python/cadence).
test-torch-oldest: $(EXT) $(OLDEST)/.stamp
	PYTHONPATH=$(CURDIR)/python $(OLDEST)/bin/python -c \
	  'import cadence, torch; assert cadence.__file__.startswith("$(CURDIR)/python/"); print("torch", torch.__version__)'
	PYTHONPATH=$(CURDIR)/python $(OLDEST)/bin/pytest -q --timeout=$(PYTEST_TIMEOUT) \
	  tests/test_torch_backend.py tests/test_fused_torch.py

bench: build
	mkdir -p bench-results
	status=0; for op in $(BENCH_OPS); do \
	  $(BENCH) --nranks 4 --op $$op -b 8 -e 64M -f 8 -n 20 -w 5 --backends cadence,gloo,mpi \
	    --json bench-results/$$op.json || status=1; \
	done; exit $$status

# Every algorithm of every collective on this machine, into the tuning table
# cadence reads by default (docs/tune.md). TUNE_ARGS="--nranks 4" for 4 ranks.
TUNE_ARGS ?=
tune: build
	$(VBIN)/cadence tune $(TUNE_ARGS)

# Across the hosts of an emulated cluster (needs root): allreduce and allgather
# at 1 and 2 ranks per host, cadence vs gloo vs Open MPI (docs/benchmarks.md).
# A failing sweep does not stop the others; the cluster is removed at the end.
CLUSTER_ARGS ?= --hosts 4 --nics 1 --rate 1gbit
CLUSTER_BENCH_ARGS ?= -b 8 -e 64M -f 2 -n 20 -w 5 --backends cadence,gloo,mpi
bench-cluster: build
	mkdir -p bench-results
	$(VBIN)/cadence cluster up --name bench $(CLUSTER_ARGS)
	status=0; for r in 1 2; do for op in allreduce allgather; do \
	  $(BENCH) --cluster bench --ranks-per-host $$r --op $$op $(CLUSTER_BENCH_ARGS) \
	    --json bench-results/cluster-x$$r-$$op.json | tee bench-results/cluster-x$$r-$$op.txt \
	    || status=1; \
	done; done; \
	$(VBIN)/cadence cluster down --name bench; exit $$status

# Random collectives (every kind, size, dtype, op, algorithm, sub-communicators,
# async batches) on an emulated 3-host x 2-rank cluster while links are cut
# and slowed, every result checked (needs root; docs/soak.md). Fails on a wrong
# result, a hang, a crash or a failure no fault explains. Logs and
# summary.json in soak-results/. SOAK_ARGS="--duration 300 --seed 7" to change.
SOAK_ARGS ?= --duration 1800
soak: build
	$(VBIN)/cadence soak --out soak-results $(SOAK_ARGS)

# The same properties `cargo test` runs with a small budget (handshake
# machines; frames into a receiving TcpLink over loopback), many more cases.
FUZZ_CASES ?= 100000
fuzz:
	PROPTEST_CASES=$(FUZZ_CASES) cargo test -p cadence-core --release --test fuzz_wire -- --nocapture

# All three run, whatever the first ones say; the target fails if any did.
lint: $(VENV)/.stamp-deps
	status=0; \
	cargo fmt --all --check || status=1; \
	$(CARGO_ENV) cargo clippy --workspace --all-targets -- -D warnings || status=1; \
	$(VBIN)/ruff check python tests benchmarks || status=1; \
	exit $$status

clean:
	cargo clean
	rm -rf $(VENV) $(OLDEST) $(NOTORCH) $(EXT) bench-results .pytest_cache .ruff_cache
	find python tests -name __pycache__ -type d -prune -exec rm -rf {} +

# The downloaded wheels live outside the checkout; this forgets them too.
clean-cache:
	rm -rf $(HOME)/.cache/cadence/wheels
