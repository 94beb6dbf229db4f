"""Rule heads_topk: every task with the top-k ranked heads removed, beside random-k controls."""

from gna.core.chance import ChancePolicy
from gna.core.runtime import setup
from gna.core.settings import Evaluation, Files, TopK
from gna.phases.head_tables import run_heads_topk

setup(snakemake.log[0], snakemake.threads, outputs=snakemake.output)
p = snakemake.params
run_heads_topk(
    snakemake.wildcards.model,
    Files.of(snakemake.input),
    Files.of(snakemake.output),
    top_k=TopK(**p.top_k),
    max_items=p.max_items,
    evaluation=Evaluation(**p.evaluation),
    chance=ChancePolicy(**p.chance),
)
