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


onsuccess:
    # Bookkeeping after jobs ran (not after a dry run or "nothing to be done"): the run record
    # (wall times, machine, commit; not a result, so no rule's output) and every folder DVC tracks.
    from gna.core.sharing import ensure_tracked_folders
    from gna.report.run_record import RUN_RECORD, write_run_record

    if not workflow.touch:
        write_run_record(RUN_RECORD, "data/benchmarks", "data/logs", config, workflow.basedir)
    ensure_tracked_folders(os.path.join(workflow.basedir, "dvc.yaml"))
