# hpclab: two commands do everything on a fresh machine.
#   make run       set up .venv, run every notebook on 4 MPI engines into build/
#   make test      set up .venv with the test extra, run the whole suite (simulator)
#   make test-gpu  the whole suite on this machine's GPUs (benchmarks/test_gpu.sh)
# and for working through the notebooks:
#   make lab      JupyterLab on the whole workbook (notebooks/, exercises/, solutions/, my-work/)
#   make my-work  copy exercises/ into my-work/ (yours: never overwritten, not in git)
# GPU_STACK picks the GPU stack that setup installs (tools/gpu_stack.py): auto (default) reads the
# driver's CUDA version from nvidia-smi (12.x: cu12, 13.x: cu13; no driver: none, the simulator);
# on a login node without GPUs, name the GPU nodes' stack: make setup GPU_STACK=cu12.
# ENGINES stays 4 on any machine: the notebooks follow the workshop's four ranks, and on a node
# with fewer GPUs the ranks share them (the notebooks say where that measures time sharing).
PYTHON  ?= python3
VENV    ?= .venv
ENGINES ?= 4
GPU_STACK ?= auto
BIN     := $(VENV)/bin
# The mpich wheel gives mpiexec where the machine has no MPI; a cluster's own MPI
# (module load openmpi) is used when its mpiexec is on PATH.
MPI_EXTRA := $(if $(shell command -v mpiexec 2>/dev/null),,mpi)
comma := ,
EXTRAS_RUN  := $(subst $(eval) ,$(comma),$(strip lab $(MPI_EXTRA)))
EXTRAS_TEST := $(subst $(eval) ,$(comma),$(strip test $(MPI_EXTRA)))
export PATH := $(abspath $(BIN)):$(PATH)

.PHONY: run test test-gpu lab stop exercises my-work bench clean setup install-shared FORCE

$(BIN)/python:
	@echo "hpclab setup: a virtual environment in $(VENV) ($(PYTHON) -m venv), with the newest pip"
	@$(PYTHON) -m venv $(VENV)
	@$(BIN)/python -m pip install -q --upgrade pip

# Says which GPU stack and why on every run; the file changes (and the install reruns) only
# when the choice does.
$(VENV)/.gpu-stack: FORCE | $(BIN)/python
	@$(PYTHON) tools/gpu_stack.py $(GPU_STACK) --record $@

$(VENV)/.installed-run $(VENV)/.installed-test: $(VENV)/.installed-%: pyproject.toml $(VENV)/.gpu-stack | $(BIN)/python
	@extras="$(EXTRAS_$(if $(filter run,$*),RUN,TEST))$$(cat $(VENV)/.gpu-stack)"; \
	echo "hpclab setup: pip install -e '.[$$extras]' into $(VENV) (hpclab and what it needs; minutes the first time)"; \
	$(BIN)/python -m pip install -q -e ".[$$extras]"
	@touch $@

setup: $(VENV)/.installed-run

run: $(VENV)/.installed-run
	$(BIN)/python -m hpclab info
	$(BIN)/python -m hpclab workbook --engines $(ENGINES) --out build

# The whole suite in four lanes side by side (tools/test_lanes.py): engines and notebooks, two halves of the
# Slurm tier, the library's tests; each lane's slowest tests are printed.
test: $(VENV)/.installed-test
	$(BIN)/python -m hpclab exercises check
	$(BIN)/python tools/test_lanes.py

# The suite on real GPUs: HPCLAB_BACKEND=gpu, MPI tests through $$HPCLAB_MPIEXEC or $$MPIRUN, notebooks
# on max(2, GPUs) GPU engines. With the project's .venv: make test-gpu. On a GPU node without
# network: source benchmarks/offline_env.sh; make test-gpu PYTHON_RUN=python3 (no .venv needed).
PYTHON_RUN ?= $(BIN)/python
test-gpu: $(if $(filter $(BIN)/python,$(PYTHON_RUN)),$(VENV)/.installed-test)
	PYTHON_RUN=$(PYTHON_RUN) bash benchmarks/test_gpu.sh

# Rooted at the repository, so every folder is one click away. It starts no engines: each
# notebook starts its own when it connects and stops them at its end (on a login node, with a
# profile from `hpclab cluster init --slurm`: as a Slurm job). LAB_ARGS adds options
# (tests/test_lab.py runs this recipe with --no-browser, a port and a token).
# (Jupyter refuses to run as root without --allow-root: containers often run as root.)
lab: $(VENV)/.installed-run
	$(BIN)/jupyter lab --ServerApp.root_dir="$(CURDIR)" $(if $(filter 0,$(shell id -u)),--allow-root) $(LAB_ARGS)

stop:
	-$(BIN)/python -m hpclab cluster stop

exercises: $(VENV)/.installed-run
	$(BIN)/python -m hpclab exercises build

my-work: $(VENV)/.installed-run
	$(BIN)/python -m hpclab exercises copy

# Every topic's GPU benchmark and GPU checks on this GPU node (results in build/bench/; then
# `python benchmarks/record.py build/bench` adds them to the curated tables); needs real GPUs.
bench: $(VENV)/.installed-run
	@nvidia-smi -L >/dev/null 2>&1 || { echo "make bench needs NVIDIA GPUs (nvidia-smi found none)"; exit 1; }
	OUT=build/bench bash benchmarks/gpu_suite.sh

# One environment for a room on a shared filesystem, each learner with their own work folder (docs/instructor.md,
# *Onboarding a room*): make install-shared PREFIX=/shared/hpclab [GPU_STACK=cu12]
install-shared:
	@test -n "$(PREFIX)" || { echo "usage: make install-shared PREFIX=/a/folder/on/a/shared/filesystem"; exit 2; }
	GPU_STACK=$(GPU_STACK) PYTHON=$(PYTHON) bash tools/install_shared.sh $(PREFIX)

clean:
	rm -rf build .pytest_cache
