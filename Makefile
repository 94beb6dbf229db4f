# Two commands do everything:  `make reproduce` (set up + run the default study)  and  `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
CORES  ?= all
# pytest-xdist workers for the tests; modules that share a fixture run in one (tests/conftest.py)
TEST_WORKERS ?= 2
WORKERS := -n $(TEST_WORKERS)

.PHONY: venv gpu gpu-wheels reproduce check headline findings timing-table test test-fast lint smoke-golden smoke-plan gpu-check dryrun pull push report lock peers

# torch first, pinned to the CPU wheel (any looser spec can pull a multi-GB CUDA build), then
# the project under a full constraint file so the resolver cannot replace it.
$(STAMP): pyproject.toml requirements.lock
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install torch==2.13.0
	$(BIN)/python -m pip install -c requirements.lock -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

## mamba-ssm's Triton SSD kernel, the SSM heads' scan on a GPU (gna.engine.ssm_kernel). Its package
## is built without its CUDA extension (selective_scan_cuda, which no rule uses): setup.py reads
## torch.version.cuda, so it builds against the installed torch (no build isolation), and a forced
## local build skips its prebuilt-wheel lookup. Triton comes with a CUDA torch; it is installed here
## where it does not: the tests run the kernel on the CPU through Triton's interpreter.
MAMBA_SSM := mamba-ssm==2.3.2.post1
TRITON    := triton==3.7.1
gpu: venv
	$(BIN)/python -c "import triton" 2>/dev/null || $(BIN)/python -m pip install $(TRITON)
	$(BIN)/python -m pip install einops==0.8.2 ninja==1.13.2
	MAMBA_SKIP_CUDA_BUILD=TRUE MAMBA_FORCE_BUILD=TRUE $(BIN)/python -m pip install --no-build-isolation --no-deps $(MAMBA_SSM)
	$(BIN)/python -c "from gna.engine.ssm_kernel import load_kernel; assert load_kernel() is not None; print('mamba-ssm SSD kernel: ready')"

## Run the whole study on the default config (config/config.yaml) through DVC, which runs
## `snakemake --cores $(CORES)` and records every output in its cache. First, a tracked output
## that no job wrote (edited, replaced, added or deleted by hand) is set aside and restored from
## the DVC cache or computed again, so DVC never records it (gna.core.guard names each one). Then
## the machine's matmul peak is measured (gna.engine.peak, ~10 s): the run record reads each step's
## useful GFLOP/s as a fraction of it.
reproduce: venv
	$(BIN)/python -m gna.core.guard
	$(BIN)/python -m gna.engine.peak data/run/peak.json
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/dvc repro
	-$(CHECK)

## Did the run reproduce main's? The headline numbers and verdicts of data/ against docs/headline.json
## (a default run's, reviewed): per entry equal / within its interval / differs, per verdict the
## same or changed, then one line. Numbers move between CPU kinds in bf16 rounding; verdicts should not.
## `make headline` records this run's as the new reference (after review).
# called directly by reproduce, not through a second make: that one would check the venv again
# without the caller's options (make does not pass -o down) and could reinstall it
CHECK := $(BIN)/python -m gna.report.headline check docs/headline.json data
check: venv
	$(CHECK)

headline: venv
	$(BIN)/python -m gna.report.headline write data docs/headline.json
	$(MAKE) --no-print-directory findings

## docs/findings.md and its figures (docs/figures/), written from docs/headline.json: the study's
## claims beside each model's result (gna.report.findings; a test checks the committed page)
findings: venv
	$(BIN)/python -m gna.report.findings docs/headline.json docs/findings.md

## The test suite (unit tests on tiny models, the workflow on config/smoke.yaml, one test on
## the real default model). `make test-fast` skips tests marked slow.
## (gpu: the tests run mamba-ssm's SSD kernel through Triton's interpreter against the torch scan)
test: venv gpu lint
	$(BIN)/python -m pytest -m "not extended" $(WORKERS)

## ruff: the lint rules and the format in pyproject.toml ([tool.ruff]); `$(BIN)/ruff format .` formats
lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

test-extended: venv
	$(BIN)/python -m pytest -m extended

test-fast: venv gpu lint
	$(BIN)/python -m pytest -m "not slow and not extended" $(WORKERS)

## Refresh the golden smoke results (tests/data/smoke_results) that the golden test compares every smoke run
## against, the student stages' inputs and the device spread (about 13 minutes on 2 cores): only after a
## change that is meant to change results.
smoke-golden: venv
	$(BIN)/python tests/golden.py refresh
	$(BIN)/python tests/golden.py spread

## The README's time table: the latest run's record (data/run/record.json) kept as its CPU kind's in
## docs/runs/, then the table of every kept record written into the README (gna.report.timing_table)
timing-table: venv
	$(BIN)/python -m gna.report.timing_table keep data/run/record.json docs/runs
	$(BIN)/python -m gna.report.timing_table write docs/runs README.md

## The smoke config's jobs as a plan (tests/data/smoke_plan.json) that benchmarks/gpu_check.py runs
## without Snakemake (gna.core.replay); a test says when the workflow has changed under it.
smoke-plan: venv
	$(BIN)/python -m gna.core.replay record config/smoke.yaml tests/data/smoke_plan.json

## The wheels a bare, offline CUDA node lacks for benchmarks/gpu_check.py (about 73 MB, into
## gpu-wheels/), at requirements.lock's versions for that node's Python (GPU_PY): polars and
## jsonschema; transformers (a node's 5.17 runs Gemma 2 uncapped; gpu_check refuses it) with the
## regex it checks at import and what its huggingface-hub 2 needs that a 5.17 node's hub 1 did not (httpx2 and its own, click, hf-xet;
## tokenizers and safetensors stay: 5.23 asks for the same); mamba-ssm built without its CUDA
## extension (docs/gpu.md).
GPU_PY ?= 3.12
GPU_WHEELS := $(shell grep -iE '^(polars|polars-runtime-32|jsonschema|jsonschema-specifications|referencing|rpds-py|transformers|regex|huggingface_hub|httpx2|httpcore2|truststore|anyio|idna|h11|click|hf-xet)==' requirements.lock)
gpu-wheels: venv
	rm -rf gpu-wheels && mkdir -p gpu-wheels
	$(BIN)/python -m pip download --no-deps --only-binary=:all: --python-version $(GPU_PY) --implementation cp \
	  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d gpu-wheels $(GPU_WHEELS)
	MAMBA_SKIP_CUDA_BUILD=TRUE MAMBA_FORCE_BUILD=TRUE $(BIN)/python -m pip wheel --no-build-isolation --no-deps $(MAMBA_SSM) -w gpu-wheels
	du -sh gpu-wheels

## On a CUDA machine: kernel, paper-shape timings, the smoke jobs on the GPU against the golden
## results and the unit tests with models on the GPU, in one JSON (README "GPUs").
gpu-check:
	python benchmarks/gpu_check.py --out gpu_check.json

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

## Snakemake's own interactive report (figures with captions, and the run's job statistics, which
## describe the machine: so it goes with the run record, which DVC does not track).
report: venv
	$(BIN)/snakemake --report data/run/snakemake-report.html

lock: venv
	head -2 requirements.lock > requirements.lock.new
	$(BIN)/python -m pip freeze --exclude-editable | sed 's/^torch==.*/torch==2.13.0/' >> requirements.lock.new
	mv requirements.lock.new requirements.lock

## The peer tools of benchmarks/head_sweep_peers.py (TransformerLens, nnsight and the few
## dependencies the project lacks), pinned, into .peers/ beside the venv: the project's own
## environment and lock are left as they are. Use with PYTHONPATH=.peers.
PEERS := transformer-lens==4.3.0 nnsight==0.8.1 einops==0.8.2 jaxtyping==0.3.11 wadler-lindig==0.1.8 \
	fancy-einsum==0.0.3 beartype==0.23.1 typeguard==4.6.1 sentencepiece==0.2.3 websocket-client==1.9.2 \
	zstandard==0.25.0 httpx==0.28.1 httpcore==1.0.9 sniffio==1.3.1
peers: venv
	$(BIN)/python -m pip install --quiet --no-deps --target .peers $(PEERS)
