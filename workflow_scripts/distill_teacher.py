"""Rule distill_teacher: the distillation corpus and the teacher's activations on it."""

from gna.core.runtime import run_rule
from gna.students.teacher_file import DistillTeacher, run_distill_teacher

run_rule(snakemake, run_distill_teacher, DistillTeacher)
