"""Rule distill_align: fit every SSM head of one state size to its teacher attention head."""

from gna.core.runtime import run_rule
from gna.students.alignment import DistillAlign, run_distill_align

run_rule(snakemake, run_distill_align, DistillAlign)
