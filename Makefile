# `make local-run` and `make test` each create or reuse .venv and (re)install the project when
# pyproject.toml changes; nothing else needs to be set up by hand.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
DEPS_HASH := $(shell sha256sum pyproject.toml | cut -c1-16)
STAMP := $(VENV)/.installed-$(DEPS_HASH)
CONFIG ?=
REGISTRY ?= ghcr.io/batchscale
TAG ?= 0.1.0

.PHONY: venv local-run test test-fast bench docs compile lint clean images images-check

# pip byte-compiles what it installs, on purpose: where PYTHONDONTWRITEBYTECODE is set (as on
# our CI machines) nothing imported later is cached, and with --no-compile every process
# (xdist workers, torchrun ranks, sweep trials, kfp.local tasks) compiled its imports again: a
# first `import torch, pandas, ...` took 11.0 s against 5.7 s, and the fresh-clone test run
# got slower although the install took 91 s instead of 125 s.
$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --no-cache-dir --disable-pip-version-check -e '.[dev]'
	@rm -f $(VENV)/.installed-*
	@touch $@

venv: $(STAMP)

local-run: venv
	$(VENV)/bin/batchscale run $(if $(CONFIG),--config $(CONFIG)) $(RUN_FLAGS)

# Two phases: the tests that measure time or assert a tight time bound (marked `serial`) run alone;
# the rest run on TEST_WORKERS processes, one test file per process at a time (module
# fixtures such as test_pipeline's run are made once). Both print their slowest tests.
# The parallel phase runs torch single-threaded: each worker (and each torchrun rank it starts)
# would otherwise start one thread per core, and on a 2-core machine their OpenMP threads
# spin-wait against each other: two concurrent training runs took 113 s instead of 59 s, and
# the phase took 19:53 minutes in one fresh-clone run without it against 9:52-11:20 in four
# runs with it (docs/architecture.md, "Tests"). The serial phase keeps the default threads.
# The tests marked `waits` (sockets that never answer, asleep for most of their two minutes) run
# in a third process beside the workers, their output shown after the workers' summary: on a
# worker they held one of the two CPUs idle.
TEST_WORKERS ?= 2
test: venv
	@waits_log=$$(mktemp); \
	OMP_NUM_THREADS=1 $(VENV)/bin/pytest -q -m "waits and not serial" --durations=5 >$$waits_log 2>&1 & waits=$$!; \
	OMP_NUM_THREADS=1 $(VENV)/bin/pytest -q -n $(TEST_WORKERS) --dist loadfile -m "not serial and not waits" --durations=30; status=$$?; \
	wait $$waits; waits_status=$$?; echo "--- tests marked waits (run beside the workers):"; cat $$waits_log; rm -f $$waits_log; \
	test $$status -eq 0 && test $$waits_status -eq 0
	$(VENV)/bin/pytest -q -m serial --durations=10

test-fast: venv
	$(VENV)/bin/pytest -q -m "not slow"

bench: venv
	$(PY) -m benchmarks.run $(BENCH)

# The documentation site (mkdocs.yml) into .site/; a broken link or anchor fails the build.
docs: venv
	$(VENV)/bin/mkdocs build --strict

compile: venv
	BATCHSCALE_IMAGE=$(REGISTRY)/batchscale-cpu:$(TAG) \
	BATCHSCALE_GPU_IMAGE=$(REGISTRY)/batchscale-cuda:$(TAG) \
	$(VENV)/bin/batchscale compile $(if $(CONFIG),--config $(CONFIG)) --output pipeline.yaml

# Builds both images from this checkout (context: the repository root) and pushes them to
# $(REGISTRY) with $(TAG); `make compile` with the same REGISTRY and TAG points the YAML at them.
# BASE_IMAGE (optional) replaces the Dockerfiles' upstream Python base, e.g. with a mirror of it.
DOCKER ?= docker
BASE_IMAGE ?=
GIT_COMMIT ?= $(shell git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)$(shell git diff --quiet HEAD 2>/dev/null || echo -dirty)
IMAGE_BUILD_ARGS = --build-arg BATCHSCALE_GIT_COMMIT=$(GIT_COMMIT) \
	$(if $(BASE_IMAGE),--build-arg BASE_IMAGE=$(BASE_IMAGE))
images:
	$(DOCKER) build -f images/Dockerfile.cpu $(IMAGE_BUILD_ARGS) \
		-t $(REGISTRY)/batchscale-cpu:$(TAG) .
	$(DOCKER) build -f images/Dockerfile.cuda $(IMAGE_BUILD_ARGS) \
		-t $(REGISTRY)/batchscale-cuda:$(TAG) .
	$(DOCKER) push $(REGISTRY)/batchscale-cpu:$(TAG)
	$(DOCKER) push $(REGISTRY)/batchscale-cuda:$(TAG)

# Builds the CPU image (FLAVOURS="cpu cuda": both) for real with buildah (no Docker engine) FROM a
# local Debian base and runs a pipeline component in it as KFP would (images/check.sh says how
# and what it needs). Slow, needs root: not part of `make test` or CI.
images-check:
	images/check.sh

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports --no-cache

clean:
	-$(VENV)/bin/batchscale clean
	rm -rf build dist *.egg-info .pytest_cache .ruff_cache pipeline.yaml
