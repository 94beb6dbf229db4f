"""Rule distill_corpus_check: neither the distillation corpus nor the KV prompts of checkpoint
selection hold an evaluation item (MMLU question or KV prompt)."""

from gna.core.runtime import run_rule
from gna.students.corpus import DistillCorpusCheck, run_distill_corpus_check

run_rule(snakemake, run_distill_corpus_check, DistillCorpusCheck)
