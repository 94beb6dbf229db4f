"""The hybrid phase's rule functions as the tests call them: each with its files and scoring
settings given as keywords (the scripts pass Snakemake's input/output and the rule's settings,
run_rule), and the corpus and KD settings of the tiny students (the `phase` fixture of
conftest.py). Imported as `unit.students.rules`: tests/unit/students is a package (its
__init__.py), so that its conftest.py does not take the module name `conftest` of tests/conftest.py."""

from gna.core.chance import ChancePolicy
from gna.core.settings import Evaluation, Files, StudentScoring
from gna.students.recipe import HybridAblation, run_hybrid_ablation
from gna.students.student_evaluation import (
    HybridBudget,
    HybridScore,
    HybridSwap,
    run_hybrid_budget,
    run_hybrid_score,
    run_hybrid_swap,
)
from gna.students.student_masking import HybridAnswerRows, run_hybrid_answer_rows

CORPUS = {
    "seq_len": 32,
    "train_windows": 6,
    "align_windows": 4,
    "heldout_windows": 2,
    "kv_sizes": [3, 5],
    "kv_share": 0.5,
    "heldout_share": 0.2,
}
KD = {"steps": 2, "batch": 2, "lr": 1e-3, "answer_weight": 5, "compute_dtype": "bfloat16"}


ON = ChancePolicy(skip=True)  # the default config's policy


# the rules' functions with their files and scoring settings given as keywords (the scripts pass
# Snakemake's input/output and the rule's settings)
def _scoring(max_items=None, degeneracy_items=None, evaluation=Evaluation(), chance=ON, dict_size=None):
    return StudentScoring(max_items, degeneracy_items, dict_size, chance, evaluation)


def score(
    model_name,
    variant,
    model_dir,
    teacher,
    tasks,
    summary,
    answers,
    *,
    baseline_paths=(),
    teacher_summary_path=None,
    kv_dict_size=None,
    degeneracy_dict_size=None,
    **scoring,
):
    inputs = Files(
        model=model_dir,
        teacher=teacher,
        tasks=tasks,
        baseline=list(baseline_paths),
        teacher_summary=teacher_summary_path,
    )
    settings = HybridScore(model_name, variant, _scoring(dict_size=degeneracy_dict_size, **scoring), kv_dict_size)
    return run_hybrid_score(inputs, Files(summary=summary, answers=answers), settings)


def swap_layer(
    model_name, variant, model_dir, ranking, teacher, tasks, summary, answers, *, teacher_summary_path=None, **scoring
):
    inputs = Files(model=model_dir, ranking=ranking, teacher=teacher, tasks=tasks, teacher_summary=teacher_summary_path)
    settings = HybridSwap(model_name, variant, _scoring(**scoring))
    return run_hybrid_swap(inputs, Files(summary=summary, answers=answers), settings)


def answer_rows(
    model_name,
    variant,
    model_dir,
    tasks,
    out,
    *,
    teacher_summary_path=None,
    answers_path=None,
    **scoring,
):
    inputs = Files(model=model_dir, tasks=tasks, teacher_summary=teacher_summary_path, answers=answers_path)
    settings = HybridAnswerRows(model_name, variant, _scoring(**scoring))
    return run_hybrid_answer_rows(inputs, Files(answer_rows=out), settings)


def budget(
    model_name,
    variant,
    model_dir,
    checkpoints,
    teacher,
    task,
    out,
    *,
    dict_size,
    summary_path=None,
    answers_path=None,
    aligned=None,
    facts=(),
    teacher_answers=(),
    **scoring,
):
    inputs = Files(
        model=model_dir,
        checkpoints=checkpoints,
        teacher=teacher,
        task=task,
        summary=summary_path,
        answers=answers_path,
        aligned=aligned,
        facts=list(facts),
        teacher_answers=list(teacher_answers),
    )
    settings = HybridBudget(model_name, variant, _scoring(dict_size=dict_size, **scoring))
    knowledge = str(out).replace(".parquet", "-training-facts.comparisons.parquet")
    steps = str(out).replace(".parquet", ".comparisons.parquet")
    return run_hybrid_budget(inputs, Files(budget=out, knowledge=knowledge, comparisons=steps), settings)


def ablation(
    model_name,
    which,
    variant,
    model_dir,
    teacher,
    aligned,
    ranking,
    task,
    out,
    *,
    align,
    kd,
    align_windows,
    seed,
    dict_size,
    select=None,
    validation=None,
    **scoring,
):
    inputs = Files(model=model_dir, teacher=teacher, aligned=aligned, ranking=ranking, task=task, validation=validation)
    recipe = {"align": align, "kd": kd, "align_windows": align_windows, "seed": seed}
    settings = HybridAblation.of(
        {
            "model": model_name,
            "ablation": which,
            "variant": variant,
            "recipe": recipe,
            "scoring": _scoring(dict_size=dict_size, **scoring),
            "select": select,
        }
    )
    return run_hybrid_ablation(inputs, Files(ablation=out), settings)
