# Config loading + validation, and the small get_* helpers the rules share.
import os
import re
from pathlib import Path

from gna.workflow.config import built_tasks, load_schema, validate_config
from gna.core.provenance import script_fingerprint
from gna.core.resources import mem_mb, model_params_b
from gna.core.settings import Evaluation, TopK
from gna.models.sources import check_local_sources
from gna.tasks.tables import heads_table_kv, kv_prompt_sets
from gna.workflow.plan import (
    all_results,
    answer_row_variants,
    gna_models,
    gna_students,
    model_facts,
    model_heads,
    model_prune,
    pruned_models,
    pure_ssm_variant,
    sweep_prompts,
    teachers,
)

# `--configfile X` replaces the default config instead of merging model lists into it.
if not workflow.overwrite_configfiles:
    workflow.configfile(os.path.join(workflow.basedir, "config/config.yaml"))
_validated = validate_config(config, load_schema(os.path.join(workflow.basedir, "config/schema.yaml")))
config.clear()
config.update(_validated)
check_local_sources(config, workflow.basedir)

MODELS = list(config["models"])
TEACHERS = teachers(config)  # teachers of students
PRUNED_MODELS = pruned_models(config)  # models whose layers are pruned
TASKS = built_tasks(config)
FACTS_TASKS = [t for t in TASKS if t.startswith("facts_")]
# every KV-retrieval prompt set (data/tasks/<name>.parquet): the evaluation set and the phases' own
KV_SETS = kv_prompt_sets(config)
# how every model-loading rule loads and scores (dtype, eval.compute_dtype, eval.batch_size); rules
# that do not batch take it without the batch size, so that editing it does not rerun them
EVALUATION = Evaluation.from_config(config).as_params()
# the chance policy (gna.core.chance): one block for every phase
CHANCE = {"skip": config["chance"]["skip"]}
EVALUATION_UNBATCHED = {k: v for k, v in EVALUATION.items() if k != "batch_size"}
LM_EVAL_TASKS = config["lm_eval"]["tasks"]


def _alternation(names):
    return "|".join(map(re.escape, names)) if names else "(?!)"


wildcard_constraints:
    model=_alternation(MODELS),
    task=_alternation(TASKS),
    lmtask=_alternation(LM_EVAL_TASKS),
    fmt="letter|cloze",
    facts_fmt="cloze|choice",


def code_of(rule_name):
    """Fingerprint of the rule's script (workflow_scripts/<rule>.py) and of every gna module it
    imports: a `code` param, so a library change reruns exactly the rules that run it."""
    return script_fingerprint(Path(workflow.basedir) / "workflow_scripts" / f"{rule_name}.py")


def get_path(path):
    """A config path as a rule reads it: a relative one is relative to the workflow folder, an
    absolute one as written. Snakemake records inputs and params as written, so a path inside the
    working folder is given relative to it (a project moved as a whole reruns nothing) and one
    outside it in full (a working folder copied elsewhere reruns nothing)."""
    path = Path(path)
    return str(path) if path.is_absolute() else within_workdir(Path(workflow.basedir) / path)


def within_workdir(path):
    """`path` relative to the working folder where it lies inside it, else as given."""
    inside = Path(path).resolve().is_relative_to(Path.cwd().resolve())
    return os.path.relpath(path) if inside else str(path)


# keys of a model spec that size cluster jobs, select phases or set its phases but do not change the
# model (so no rerun of its conversion)
RUN_KEYS = ("params_b", "skip", "overrides")


def get_model_spec(wildcards):
    """The model's config entry without its run keys (what the model is, not how big a job it
    needs or which phases it goes through)."""
    return {k: v for k, v in config["models"][wildcards.model].items() if k not in RUN_KEYS}


def job_mem_mb(rule_name):
    """The `mem_mb` resource of `rule_name` (gna.core.resources.mem_mb) from the size of the
    model its job loads; a student is sized as its teacher."""

    def mem(wildcards):
        spec = config["models"][teacher_of(wildcards.model)]
        return mem_mb(rule_name, model_params_b(spec), config["dtype"])

    return mem


def get_model_raw(wildcards):
    spec = config["models"][wildcards.model]
    if spec["source"] == "pypi-file":
        return f"data/downloads/models/{wildcards.model}.gguf"
    if spec["source"] == "local":
        return get_path(spec["path"])
    return []


def task_file(task, model):
    """The task table `model` is scored on: data/tasks/<task>.parquet, except the multiple-choice
    facts, whose table splits known from unknown items by the model's (a student's: its
    teacher's) cloze scores (rule facts_known)."""
    if task == "facts_choice":
        return f"data/tasks/known/{teacher_of(model)}/facts_choice.parquet"
    return f"data/tasks/{task}.parquet"


def task_files(tasks, model):
    return [task_file(task, model) for task in tasks]


def get_mmlu_file(wildcards):
    data = config["tasks"]["mmlu"]["data"]
    return get_path(data["path"]) if data["source"] == "local" else "data/downloads/mmlu.jsonl"


def get_baseline_results(wildcards):
    return expand("data/results/baseline/{model}/{task}.parquet", model=MODELS, task=TASKS) + expand(
        "data/results/lmeval/{model}/{lmtask}.parquet", model=MODELS, lmtask=LM_EVAL_TASKS
    ) + (
        expand("data/results/lmeval/{model}/crosscheck_mmlu_letter.parquet", model=MODELS)
        if config["lm_eval"]["crosscheck_mmlu"] and "letter" in config["tasks"]["mmlu"]["formats"]
        else []
    )


HYBRID = config["hybrid"]

from gna.students.spec import ablation_kd, scored_tasks, split_student_name, student_name, student_variants, teacher_of


def hybrid_variants():
    """Student variant names: the heads-kept sweep at state_size, then the state-size sweep."""
    return student_variants(HYBRID)


# students that also go through the Gather-and-Aggregate rules, named like models
GNA_STUDENTS = gna_students(config)
# the attribution check compares the pre-ranking with the exact sweep, so it needs one
ATTRIBUTION_MODELS = [m for m in MODELS if model_heads(config, m)["sweep_mode"] == "exact"]


def prune_of(wildcards):
    """The prune section as the model sets it (models.<name>.overrides.prune over prune)."""
    return model_prune(config, wildcards.model)


def heads_of(wildcards):
    """The heads section as the model sets it (models.<name>.overrides.heads over heads)."""
    return model_heads(config, wildcards.model)


def topk_tasks(wildcards):
    """(task tables, baseline per-item files) of the remove-top-k table: every task's, the KV items
    from the model's heads.table_kv set where it names one (no baseline: its k = 0 is scored)."""
    own_kv = bool(heads_of(wildcards)["table_kv"])
    tables = [
        f"data/tasks/{heads_table_kv(wildcards.model)}.parquet" if own_kv and task == "kv_retrieval" else path
        for task, path in zip(TASKS, task_files(TASKS, wildcards.model))
    ]
    kept = [task for task in TASKS if not (own_kv and task == "kv_retrieval")]
    return tables, [f"data/results/baseline/{wildcards.model}/{task}.items.parquet" for task in kept]


def get_sweep_prompts(wildcards):
    """The prompts every head of the model is ablated on (gna.workflow.plan.sweep_prompts)."""
    return sweep_prompts(config, wildcards.model)[0]


GNA_MODELS = gna_models(config)


def get_ranking(wildcards):
    """A student's heads keep their teacher's identities, so it uses the teacher's ranking."""
    return f"data/results/heads/{teacher_of(wildcards.model)}/ranking.parquet"
