# gna: the Gather-and-Aggregate study as a Snakemake workflow.
# `snakemake --cores all` runs the default config (config/config.yaml); `--configfile X`
# replaces it. Each phase lives in rules/<phase>.smk; logic lives in src/gna.
from snakemake.utils import min_version

min_version("9.0")


include: "rules/common.smk"
include: "rules/models.smk"
include: "rules/tasks.smk"
include: "rules/baseline.smk"
include: "rules/prune.smk"
include: "rules/heads.smk"
include: "rules/gna.smk"
include: "rules/hybrid.smk"
include: "rules/report.smk"


rule all:
    input:
        get_all_results(),
        "data/report/index.html",
    default_target: True
