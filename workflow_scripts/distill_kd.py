"""Rule distill_kd: build one student variant from the ranking and the aligned heads, distil it."""

from gna.core.runtime import run_rule
from gna.students.kd import DistillKD, run_distill_kd

run_rule(snakemake, run_distill_kd, DistillKD)
