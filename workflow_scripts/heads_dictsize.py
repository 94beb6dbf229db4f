"""Rule heads_dictsize: KV accuracy per dictionary size with the #1 or #2 ranked head removed."""

from gna.core.runtime import run_rule
from gna.phases.head_tables import HeadsDictsize, run_heads_dictsize

run_rule(snakemake, run_heads_dictsize, HeadsDictsize)
