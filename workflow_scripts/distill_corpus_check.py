"""Rule distill_corpus_check: neither the distillation corpus nor the KV prompts of checkpoint
selection hold an evaluation item (MMLU question or KV prompt)."""

from gna.core.runtime import setup
from gna.students.corpus import run_corpus_check

setup(snakemake.log[0], snakemake.threads, outputs=snakemake.output)
p = snakemake.params
run_corpus_check(
    snakemake.input.mmlu,
    snakemake.input.kv,
    snakemake.input.validation,
    snakemake.output[0],
    corpus=p.corpus,
    seed=p.seed,
    mmlu=p.mmlu,
    template=p.template,
)
