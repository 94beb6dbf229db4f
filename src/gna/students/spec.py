"""Students: hybrid / SSM models built from a teacher by gna.students.mixer's mixer — which heads stay
attention, how a student is built, saved, described and loaded, and what it is called.

Naming (the only place that knows it): a variant `k{K}-n{N}` keeps the K best-ranked heads as
attention and makes every other head an SSM head with state size N; the student of model M
with that variant is the model `M-hybrid-k{K}-n{N}` (a folder under data/models, loadable with
gna.students.spec.load_any like any prepared model).

A student folder is a model folder (config.json + tokenizer + model.safetensors) plus
SPEC_FILE, the JSON spec saying which heads are kept as attention and the state size.

The Snakefile imports the naming functions when it parses the workflow, so this module imports
torch and the mixer only inside the functions that build or load a student.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from gna.models.folders import STUDENT_SPEC_FILE as SPEC_FILE
from gna.models.folders import is_student

STUDENT_MARK = "-hybrid-"
VARIANT_PATTERN = r"k\d+-n\d+"  # also the workflow's wildcard constraint for a variant
TEACHER_VARIANT = "teacher"  # the teacher itself, where results list it beside its students
# the distillation recipe's ablations (gna.students.recipe), each one ingredient removed
ABLATIONS = {
    "init_only": "no training: SSM heads as initialised from their attention heads",
    "no_align": "without layer alignment (end-to-end distillation from the initialisation)",
    "no_realign": "without realignment (SSM heads as aligned on the teacher's stream, not the student's own)",
    "no_answer_weight": "without answer weighting (every position weighs the same in distillation)",
    "small_corpus": "distillation on the alignment windows only (corpus.align_windows, not train_windows)",
    "no_first_token": "without the first-token share (alignment and distillation with it fixed at 0)",
}


# -- names --------------------------------------------------------------------------------------


def variant_name(heads_kept, state_size) -> str:
    """'k{heads_kept}-n{state_size}' (also with Snakemake wildcards: variant_name('{k}', '{n}'))."""
    return f"k{heads_kept}-n{state_size}"


def parse_variant(name: str) -> tuple[int, int]:
    """(heads kept, state size) of a variant name 'k{K}-n{N}'."""
    if not re.fullmatch(VARIANT_PATTERN, name):
        raise ValueError(f"not a student variant name (k<heads kept>-n<state size>): {name!r}")
    heads_kept, state_size = name[1:].split("-n")
    return int(heads_kept), int(state_size)


def student_name(model: str, variant: str) -> str:
    """The model name of `model`'s student `variant`: '<model>-hybrid-<variant>'."""
    return f"{model}{STUDENT_MARK}{variant}"


def split_student_name(name: str) -> tuple[str, str] | None:
    """(teacher, variant) of a student's model name, None for any other name."""
    teacher, mark, variant = name.rpartition(STUDENT_MARK)
    if not mark or not re.fullmatch(VARIANT_PATTERN, variant):
        return None
    return teacher, variant


def teacher_of(name: str) -> str:
    """The teacher of a student's model name; any other model is its own teacher."""
    parts = split_student_name(name)
    return name if parts is None else parts[0]


def student_variants(hybrid: dict) -> list[str]:
    """The students of a config's `hybrid` section, in order: the heads-kept sweep at
    `state_size`, then the state-size sweep at each of `state_sweep_heads_kept` (no repeats)."""
    pairs = [(k, hybrid["state_size"]) for k in hybrid["heads_kept"]]
    pairs += [(k, n) for k in hybrid["state_sweep_heads_kept"] for n in hybrid["state_sizes"]]
    return list(dict.fromkeys(variant_name(k, n) for k, n in pairs))


def in_heads_kept_sweep(hybrid: dict, variant: str) -> bool:
    """Whether `variant` is a student of the heads-kept sweep (at `state_size`)."""
    heads_kept, state_size = parse_variant(variant)
    return state_size == hybrid["state_size"] and heads_kept in hybrid["heads_kept"]


def scored_tasks(hybrid: dict, variant: str, tasks: list[str]) -> list[str]:
    """The tasks hybrid_score scores `variant` on: every task for the teacher and for the students
    of the heads-kept sweep whose k is in `knowledge_heads_kept` (absent or None: every k); KV
    retrieval only for the sweep's other students and for students of the state-size sweep alone
    (the study's knowledge contrast is pure SSM vs hybrid, its state-size finding is about
    retrieval, and the knowledge tasks' long prompts cost the most to score)."""
    if variant == TEACHER_VARIANT:
        return list(tasks)
    knowledge = hybrid.get("knowledge_heads_kept")
    if in_heads_kept_sweep(hybrid, variant) and (knowledge is None or parse_variant(variant)[0] in knowledge):
        return list(tasks)
    return [t for t in tasks if t == "kv_retrieval"]


def scored_dict_size(hybrid: dict, variant: str) -> int | None:
    """The one KV dictionary size a student of the state-size sweep alone is scored at
    (hybrid.dict_size, as the budget curve and the ablations); None (every size) for
    the teacher and the heads-kept sweep."""
    if variant == TEACHER_VARIANT or in_heads_kept_sweep(hybrid, variant):
        return None
    return hybrid["dict_size"]


def checkpoint_steps(steps: int, points: int) -> list[int]:
    """`points` + 1 step counts evenly spaced from 0 (aligned, no KD) to `steps` (the student)."""
    return sorted({round(i * steps / points) for i in range(points + 1)})


def ablation_kd(hybrid: dict) -> dict:
    """The KD settings the recipe's ablations train with: hybrid.kd, for hybrid.ablation.kd_steps
    steps when set (then a budget on the ablated student's own budget curve, whose checkpoint
    there is the full recipe they are compared with — the same budget at a fraction of the cost).
    A kd_steps that is not such a budget raises, naming the key and the allowed values."""
    steps = hybrid["ablation"].get("kd_steps")
    if steps is None:
        return dict(hybrid["kd"])
    curve, variant = hybrid["budget_curve"], hybrid["ablation"]["variant"]
    budgets = checkpoint_steps(hybrid["kd"]["steps"], curve["points"])[1:]
    if variant not in curve["variants"] or steps not in budgets:
        raise ValueError(
            f"config key 'hybrid.ablation.kd_steps': {steps} must be a budget of the budget curve of "
            f"{variant} (hybrid.budget_curve.variants {curve['variants']}); allowed: "
            f"{', '.join(map(str, budgets))} or null (hybrid.kd.steps)"
        )
    return {**hybrid["kd"], "steps": steps}


# -- which heads are SSM heads ----------------------------------------------------------------------


def ranked_heads(ranking, k: int, model_name: str = "the model") -> list[tuple[int, int]]:
    """The `k` best (layer, head) of a head ranking table (columns rank, layer, head)."""
    from gna.engine.ablation import single_heads  # the Snakefile imports this module: torch only when called

    ranking = single_heads(ranking, "a student").sort("rank")
    if k > len(ranking):
        raise ValueError(f"hybrid.heads_kept: {k} heads asked, but {model_name} has only {len(ranking)} ranked heads")
    return [(int(layer), int(head)) for layer, head in ranking.select("layer", "head").head(k).iter_rows()]


def ssm_heads_for(n_layers: int, n_heads: int, kept: list[tuple[int, int]]) -> dict[int, list[int]]:
    """{layer: its SSM heads} when the heads `kept` [(layer, head)] stay attention."""
    keep = {(int(layer), int(head)) for layer, head in kept}
    return {i: [h for h in range(n_heads) if (i, h) not in keep] for i in range(n_layers)}


# -- building, saving, loading -------------------------------------------------------------------


def make_hybrid(model, kept: list[tuple[int, int]], state_size: int):
    """Turn `model` (a transformer of a student family, gna.models.families; modified in place)
    into a hybrid keeping the attention heads `kept` [(layer, head)]; all other heads become SSM
    heads."""
    from gna.models.families import check_student_family
    from gna.students.mixer import HybridMixer, attention_name, layers_of

    check_student_family(model)
    cfg = model.config
    names = [attention_name(layer) for layer in layers_of(model)]
    if None in names:
        raise TypeError(f"layer {names.index(None)} of {type(model).__name__} has no attention module to replace")
    spec = ssm_heads_for(cfg.num_hidden_layers, cfg.num_attention_heads, kept)
    for i, (layer, name) in enumerate(zip(layers_of(model), names)):
        setattr(layer, name, HybridMixer(getattr(layer, name), cfg, spec[i], state_size, i))
    return model


def hybrid_spec(model, **extra) -> dict:
    """A hybrid's spec {"state_size", "kept_heads": [[layer, head], ...], **extra}."""
    from gna.students.mixer import mixers

    ms = mixers(model)
    kept = [[m.layer_idx, h] for m in ms for h in range(m.num_heads) if h not in m.ssm_heads]
    return {"state_size": ms[0].state_size, "kept_heads": kept, **extra}


def save_student(model, tok, out_dir: Path, spec: dict):
    """Write a student folder (call inside gna.core.io.atomic_dir)."""
    from safetensors.torch import save_model

    out_dir = Path(out_dir)
    model.config.save_pretrained(out_dir)
    tok.save_pretrained(out_dir)
    save_model(model, str(out_dir / "model.safetensors"))
    (out_dir / SPEC_FILE).write_text(json.dumps(spec, indent=2) + "\n")


def read_spec(model_dir: Path) -> dict:
    """The spec a student folder was saved with (hybrid_spec plus what distillation added)."""
    return json.loads((Path(model_dir) / SPEC_FILE).read_text())


def load_any(
    model_dir: str | Path, dtype: str = "float32", device: str | None = "auto", compute_dtype: str | None = None
):
    """(model in eval mode on `device`, tokenizer) of a prepared folder or a student's
    (load_student); `compute_dtype` as in gna.models.prepare.load_model."""
    from gna.engine.precision import linears_computed_in
    from gna.models.prepare import DTYPES, load_model

    if is_student(model_dir):
        model, tok = load_student(model_dir, DTYPES[dtype], device)
        return (model if compute_dtype is None else linears_computed_in(model, compute_dtype)), tok
    return load_model(model_dir, dtype, device, compute_dtype)


def load_student(model_dir: Path, dtype=None, device: str | None = "auto"):
    """(student in eval mode on `device`, tokenizer) from a student folder; dtype: a torch dtype
    (float32); device as in gna.engine.device.compute_device."""
    import torch
    from safetensors.torch import load_model as load_weights
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.initialization import no_init_weights

    from gna.engine.anatomy import engine_ready

    model_dir = Path(model_dir)
    spec = read_spec(model_dir)
    # every weight is read from the file below (checked), so random initialisation (~1 s for
    # 135M parameters) would only be overwritten; skipping it also skips the tying of a tied
    # output head to the input embedding, so that is done here (the file holds the pair once)
    with no_init_weights():
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir), dtype=dtype or torch.float32)
        engine_ready(model)
        make_hybrid(model, [tuple(x) for x in spec["kept_heads"]], spec["state_size"])
    model.tie_weights()
    missing, unexpected = load_weights(model, str(model_dir / "model.safetensors"), strict=False)
    # a tied embedding is stored once under one of its names (lm_head and embed_tokens, wte, …)
    embedding = model.get_input_embeddings().weight
    tied = {name for name, p in model.named_parameters(remove_duplicate=False) if p is embedding}
    tied = tied if len(tied) > 1 else set()
    if unexpected or not (set(missing) <= tied and len(missing) < 2):
        raise ValueError(
            f"{model_dir}: student weights do not match its {SPEC_FILE} "
            f"(missing {sorted(missing)[:5]}, unexpected {sorted(unexpected)[:5]})"
        )
    from gna.engine.device import compute_device  # here: the workflow reads this module without torch

    model.to(compute_device(device)).eval()
    return model, AutoTokenizer.from_pretrained(model_dir)


# the stages of training, as the through-training tables name them (gna.students.student_evaluation)
ALIGNED_STAGE = "aligned"  # the SSM heads as alignment fitted them, before realignment
KD_VS_REALIGNED = "KD checkpoint vs realigned"
THROUGH_TRAINING = "through training vs teacher"
STAGE_BY_STAGE = "each stage vs the one before"


def stage_label(kd_steps: int) -> str:
    """A KD checkpoint's stage: step 0 is the realigned student (distill_kd realigns before KD)."""
    return "realigned" if kd_steps == 0 else f"KD {kd_steps}"


def stage_order(stage: str) -> int:
    """Training order of a stage: ALIGNED_STAGE first, then stage_label's by KD step."""
    if stage == ALIGNED_STAGE:
        return -1
    return 0 if stage == "realigned" else int(stage.removeprefix("KD "))
