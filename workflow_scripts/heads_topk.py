"""Rule heads_topk: every task with the top-k ranked heads removed, beside random-k controls."""

from gna.core.runtime import setup
from gna.core.settings import Evaluation, Files
from gna.phases.head_tables import run_heads_topk

setup(snakemake.log[0], snakemake.threads, outputs=snakemake.output)
p = snakemake.params
run_heads_topk(
    snakemake.wildcards.model,
    Files.of(snakemake.input),
    snakemake.output[0],
    top_k=p.top_k,
    random_draws=p.random_draws,
    control_tasks=p.control_tasks,
    max_items=p.max_items,
    seed=p.seed,
    evaluation=Evaluation(**p.evaluation),
    skip_at_chance=p.skip_at_chance,
    control_k=p.control_k,
    control_draws=p.control_draws,
)
