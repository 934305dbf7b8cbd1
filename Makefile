# hpclab: two commands do everything on a fresh machine.
#   make run    set up .venv, run every notebook on 4 MPI engines into build/
#   make test   set up .venv with the test extra, run the whole suite
PYTHON  ?= python3
VENV    ?= .venv
ENGINES ?= 4
BIN     := $(VENV)/bin
# The mpich wheel gives mpiexec where the machine has no MPI; a cluster's own MPI
# (module load openmpi) is used when its mpiexec is on PATH.
MPI_EXTRA := $(if $(shell command -v mpiexec 2>/dev/null),,mpi)
comma := ,
EXTRAS_RUN  := $(subst $(eval) ,$(comma),$(strip lab $(MPI_EXTRA)))
EXTRAS_TEST := $(subst $(eval) ,$(comma),$(strip test $(MPI_EXTRA)))
export PATH := $(abspath $(BIN)):$(PATH)

.PHONY: run test lab stop exercises bench clean setup

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.installed-run: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e ".[$(EXTRAS_RUN)]"
	touch $@

$(VENV)/.installed-test: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e ".[$(EXTRAS_TEST)]"
	touch $@

setup: $(VENV)/.installed-run

run: $(VENV)/.installed-run
	$(BIN)/python -m hpclab info
	$(BIN)/python -m hpclab workbook --engines $(ENGINES) --out build

test: $(VENV)/.installed-test
	$(BIN)/python -m hpclab exercises check
	$(BIN)/python -m pytest -q --nbval-lax --nbval-cell-timeout=900 -p no:cacheprovider \
		tests notebooks solutions

lab: $(VENV)/.installed-run
	$(BIN)/ipcluster start --engines=MPI -n $(ENGINES) --daemonize
	$(BIN)/jupyter lab notebooks

stop:
	-$(BIN)/python -m hpclab cluster stop

exercises: $(VENV)/.installed-run
	$(BIN)/python -m hpclab exercises build

# Every topic's GPU benchmark on this GPU node (results in build/bench/); needs real GPUs.
bench: $(VENV)/.installed-run
	@nvidia-smi -L >/dev/null 2>&1 || { echo "make bench needs NVIDIA GPUs (nvidia-smi found none)"; exit 1; }
	OUT=build/bench bash benchmarks/gpu_suite.sh matmul pi comm conv ddp

clean:
	rm -rf build .pytest_cache
