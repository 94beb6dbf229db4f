"""Rule collect_baseline: every per-(model, task) baseline and lm-eval table as one tidy table."""

from gna.core.io import collect_tables, write_parquet
from gna.core.runtime import setup

setup(snakemake.log[0], outputs=snakemake.output)
write_parquet(collect_tables(snakemake.input), snakemake.output[0])
