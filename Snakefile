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
include: "rules/case.smk"
include: "rules/gna.smk"
include: "rules/students_training.smk"
include: "rules/students_scoring.smk"
include: "rules/report.smk"


# Quick model-free steps (downloads, task tables, summaries, the report) run in the Snakemake
# process itself, not as cluster jobs: a few seconds each, where a SLURM job would wait in the
# queue and for the next status check; downloads need the network a login node has.
localrules:
    all,
    fetch_model_file,
    fetch_mmlu,
    kv_task,
    mmlu_task,
    fetch_facts,
    facts_task,
    lmeval_crosscheck_task,
    collect_baseline,
    minimal_model,
    case_dev_items,
    case_minimal,
    distill_corpus_check,
    hybrid_comparisons,
    report,


rule all:
    input:
        all_results(config),
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
