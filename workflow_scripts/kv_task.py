"""Rule kv_task: the seeded KV-retrieval evaluation set as Parquet."""

from gna.core.runtime import setup
from gna.tasks.tables import write_kv_task

setup(snakemake.log[0], outputs=snakemake.output)
write_kv_task(snakemake.params.kv, snakemake.output[0])
