"""Rule hybrid_answer_rows: a hybrid's attention heads with their answer rows masked."""

from gna.core.runtime import run_rule
from gna.students.student_masking import HybridAnswerRows, run_hybrid_answer_rows

run_rule(snakemake, run_hybrid_answer_rows, HybridAnswerRows)
