"""Rule prepare_model: convert one model source into data/models/<name> (safetensors, tokenizer, provenance)."""

from gna.core.runtime import run_rule
from gna.models.prepare import PrepareModel, run_prepare_model

run_rule(snakemake, run_prepare_model, PrepareModel)
