# Two commands do everything:  `make reproduce` (set up + run the default study)  and  `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
CORES  ?= all

.PHONY: venv reproduce test test-fast smoke-golden dryrun pull push report lock

# torch first, pinned to the CPU wheel (any looser spec can pull a multi-GB CUDA build), then
# the project under a full constraint file so the resolver cannot replace it.
$(STAMP): pyproject.toml requirements.lock
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install torch==2.13.0
	$(BIN)/python -m pip install -c requirements.lock -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

## Run the whole study on the default config (config/config.yaml) through DVC, which runs
## `snakemake --cores $(CORES)` and records every output in its cache.
reproduce: venv
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/dvc repro

## The test suite (unit tests on tiny models, the workflow on config/smoke.yaml, one test on
## the real default model). `make test-fast` skips tests marked slow.
test: venv
	$(BIN)/python -m pytest -m "not extended"

test-extended: venv
	$(BIN)/python -m pytest -m extended

test-fast: venv
	$(BIN)/python -m pytest -m "not slow and not extended"

## Refresh the golden smoke results (tests/data/smoke_results) that the golden test compares every smoke run
## against: only after a change that is meant to change results.
smoke-golden: venv
	$(BIN)/python tests/golden.py refresh

dryrun: venv
	$(BIN)/snakemake -n

## Restore results from the DVC remote and make Snakemake trust them. The remote is checked first
## (gna.core.sharing: a missing or empty remote is named, with what to configure). `dvc checkout`
## restores files but not Snakemake's run records, so Snakemake would rerun everything (or miss a
## later config change); --touch re-records every output against the current config and code.
pull: venv
	$(BIN)/python -m gna.core.sharing pull
	$(BIN)/snakemake --touch --forceall --cores 1 --quiet
	$(BIN)/snakemake -n

## Send results to the DVC remote: checked first (a missing local folder is never created), and
## after the push every tracked output must be on the remote.
push: venv
	$(BIN)/python -m gna.core.sharing push

## Snakemake's own interactive report (figures with captions) beside data/report/index.html.
report: venv
	$(BIN)/snakemake --report data/report/snakemake-report.html

lock: venv
	head -2 requirements.lock > requirements.lock.new
	$(BIN)/python -m pip freeze --exclude-editable | sed 's/^torch==.*/torch==2.13.0/' >> requirements.lock.new
	mv requirements.lock.new requirements.lock
