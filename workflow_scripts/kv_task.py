"""Rule kv_task: the seeded KV-retrieval evaluation set as Parquet."""

from gna.core.runtime import run_rule
from gna.tasks.tables import KvTask, run_kv_task

run_rule(snakemake, run_kv_task, KvTask)
