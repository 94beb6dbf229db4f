"""Rule distill_kd: build one student variant from the ranking and the aligned heads, distil it."""

from gna.core.runtime import setup
from gna.core.settings import Files
from gna.students.kd import run_distill_kd
from gna.students.spec import variant_name

setup(snakemake.log[0], snakemake.threads, outputs=snakemake.output)
p = snakemake.params
run_distill_kd(
    snakemake.wildcards.model,
    variant_name(snakemake.wildcards.k, snakemake.wildcards.n),
    Files.of(snakemake.input),
    Files.of(snakemake.output),
    kd=p.kd,
    checkpoints=list(p.checkpoints),
    seed=p.seed,
    select=p.select,
    dtype=p.dtype,
    realign=p.realign,
)
