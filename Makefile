# Two entry points (see README.md, "Quick start"): `make run` and `make test`. Both install into .venv/ when needed.
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip
STAMP  := $(VENV)/.installed
FAIRSEQ := $(VENV)/.fairseq-0.12.3.1
ARGS   ?= workload=resnet optimizer=wagma
EXTRAS := dev,mpi,wandb,transformer,ddppo

.PHONY: setup setup-user sysdeps run test test-long lint gpu-check gpu-wheels
setup: $(STAMP)

# MiniWorld (workload=ddppo's embedded 3-D rooms) renders headless through EGL with Mesa's software
# renderer: libEGL (glvnd) and Mesa's EGL/GL drivers. Present on this image; installed when missing.
sysdeps:
	@missing=0; for lib in libEGL.so.1 libEGL_mesa.so.0 libGL.so.1 libGLU.so.1; do \
		ldconfig -p | grep -q "$$lib" || missing=1; done; \
	if [ $$missing = 1 ]; then \
		apt-get update -q && apt-get install -y -q --no-install-recommends libegl1 libegl-mesa0 libgl1 libgl1-mesa-dri libglu1-mesa; \
	fi
	@# SLURM daemons + munge for the private test cluster (tests/test_slurm.py); no-op when installed
	slurm/local/slurmctl.sh install

# torch/torchvision first: the exact builds on this machine's disk (pip would otherwise pull a second
# multi-GB build). The project itself is installed editable with every extra the test suite uses.
$(STAMP): pyproject.toml
	$(MAKE) --no-print-directory sysdeps
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==2.14.1 torchvision==0.29.1
	$(MAKE) --no-print-directory $(FAIRSEQ)
	$(PIP) install -q -e '.[$(EXTRAS)]'
	touch $@

# fairseq (workload=transformer): fairseq-fixed is fairseq 0.12.2 with the fix that lets it import on
# Python 3.11. Built against the torch and numpy already here (--no-build-isolation: an isolated build
# would download a second torch), so its build requirements come first; ~4 min (6 C++/Cython
# extensions). Its own stamp: a change of pyproject.toml does not rebuild it.
$(FAIRSEQ):
	$(PIP) install -q cython setuptools wheel numpy
	$(PIP) install -q --no-build-isolation fairseq-fixed==0.12.3.1
	touch $@

# Without root (a cluster's login node; docs/slurm.md, "Installing without root"): no apt-get, no SLURM daemons.
# Into $(VENV) (`make setup-user VENV=$$HOME/venvs/wb` for a path the compute nodes see): torch as pip resolves
# it here (TORCH='torch==2.5.1 torchvision==0.20.1 --index-url https://download.pytorch.org/whl/cu124' for your
# site's CUDA), fairseq-fixed as above (the Transformer, and WMT's fairseq-preprocess), the extras of the three
# workloads. Not the `mpi` extra: its mpich wheel bypasses the fabric (build mpi4py against the site's MPI, as
# `wagma-bench doctor` says). Ends with doctor's table: what is present, the command for what is missing.
# PIP_FLAGS go to every pip call (the test runs it with --dry-run --no-index as a non-root user).
USER_EXTRAS := wandb,transformer,ddppo
TORCH ?= torch torchvision
PIP_FLAGS ?=
setup-user:
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q $(PIP_FLAGS) $(TORCH)
	$(PY) -m pip install -q $(PIP_FLAGS) cython setuptools wheel numpy
	$(PY) -m pip install -q $(PIP_FLAGS) --no-build-isolation fairseq-fixed==0.12.3.1
	$(PY) -m pip install -q $(PIP_FLAGS) -e '.[$(USER_EXTRAS)]'
	$(PY) -m wagma_bench doctor

run: $(STAMP)
	$(VENV)/bin/wagma-bench run $(ARGS)

# In three phases, all always run. First the tests that time nothing on two pytest-xdist workers (the cores idle
# a quarter of a serial run: a run's start imports on one core, sleeps, launchers waiting), a file's tests on
# one worker (its module fixtures made once; two local SLURM clusters coexist: free ports, a munged each),
# the longest files first (tests/file_order.py, from the lengths measured in tests/durations.json). Then the
# tests marked `alone` (MPI's busy-polling ranks, WAGMA-SGD's CPU-bound run to its target) with nothing beside
# them. Last the other `serial` tests (a wait, a margin or a deadline they assert) one at a time, and beside
# them, at idle CPU priority (SCHED_IDLE: the scheduler runs them only on a core no other process wants), the
# files marked `background`, which time nothing and bear pauses: the serial tests leave about half of the two
# cores idle, and those files fill it. Their output is kept in a file and shown when they end; Ctrl-C stops them
# too (a shell starts a background command with Ctrl-C ignored: env restores it) and removes the file. Two
# workers share two cores: each process computes on one thread (OMP_NUM_THREADS=1, as torchrun sets for its
# ranks).
PYTEST_WORKERS := -n 2 --dist loadfile --no-loadscope-reorder -p tests.file_order
# The later phases collect only the files that use their marker (collecting every file imports torch, fairseq
# and the rest: about 5 s a phase here); a marker is always written pytest.mark.NAME in the file that uses it
# (directly, in pytestmark or in a param's marks), never added by a hook.
marked = $(shell grep -l 'pytest\.mark\.$(1)\b' tests/test_*.py)
test: $(STAMP)
	@OMP_NUM_THREADS=1 $(VENV)/bin/pytest -q $(PYTEST_WORKERS) -m "not long and not serial and not alone and not background"; \
	first=$$?; \
	$(VENV)/bin/pytest -q -m "alone and not long" $(call marked,alone); alone=$$?; \
	log=$$(mktemp); trap 'rm -f "$$log"; exit 130' INT TERM; \
	OMP_NUM_THREADS=1 env --default-signal=INT chrt --idle 0 $(VENV)/bin/pytest -q \
		$(PYTEST_WORKERS) -m "background and not long and not serial and not alone" $(call marked,background) \
		>$$log 2>&1 & idle=$$!; \
	$(VENV)/bin/pytest -q -m "serial and not alone and not long" $(call marked,serial); serial=$$?; \
	echo "idle-priority tests (beside the serial ones):"; wait $$idle; background=$$?; cat $$log; rm -f $$log; \
	test $$first = 0 && test $$alone = 0 && test $$serial = 0 && test $$background = 0

# The multi-minute runs to a target (every baseline optimizer on ResNet, the Transformer to its BLEU).
test-long: $(STAMP)
	$(VENV)/bin/pytest -q -m long

lint: $(STAMP)
	$(VENV)/bin/ruff format --check wagma_bench tests
	$(VENV)/bin/ruff check wagma_bench tests reproduce

# On a machine with a GPU (reproduce/gpu/check.py): NCCL and shared-GPU gloo worlds for every optimizer,
# images/s against a plain torch loop in fp32 and bf16, comm-bench; sized for 8 min. No install: this repository with
# the machine's own Python and torch (the project's .venv where there is one); without CUDA it says so.
GPU_PY ?= $(if $(wildcard $(PY)),$(PY),python3)
GPU_WHEELS := reproduce/gpu/wheels
gpu-check:
	$(GPU_PY) reproduce/gpu/check.py

# For an offline GPU machine: Hydra, OmegaConf and their dependencies as wheels in $(GPU_WHEELS) (ignored by
# git; copy it along). PyYAML is the one compiled wheel: for another Python than this one's, give
# GPU_PYTHON_VERSION=3.10 (manylinux x86_64).
gpu-wheels:
	$(GPU_PY) -m pip wheel -q --no-deps -w $(GPU_WHEELS) hydra-core==1.3.2 omegaconf==2.3.0 \
		antlr4-python3-runtime==4.9.3 packaging
	$(GPU_PY) -m pip download -q --no-deps --only-binary=:all: -d $(GPU_WHEELS) PyYAML \
		$(if $(GPU_PYTHON_VERSION),--python-version $(GPU_PYTHON_VERSION) --platform manylinux2014_x86_64)
	@ls $(GPU_WHEELS)
