"""Rule prepare_model: convert one model source into data/models/<name> (safetensors, tokenizer,
provenance)."""

from gna.core.runtime import peak_rss_mb, setup
from gna.models.prepare import prepare_model

log = setup(snakemake.log[0], snakemake.threads, outputs=snakemake.output)
info = prepare_model(
    snakemake.wildcards.model,
    snakemake.params.spec,
    snakemake.output[0],
    source_path=snakemake.params.source_path,
    dtype=snakemake.params.dtype,
)
log.info(
    "prepared %s: %s, %d layers, %.1fM params, peak RSS %.0f MB",
    info["name"],
    info["architecture"],
    info["n_layers"],
    info["n_params"] / 1e6,
    peak_rss_mb(),
)
