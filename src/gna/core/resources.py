"""The memory a rule's job asks a scheduler for, from the size of the model it loads.

Rules declare `mem_mb` through this table instead of a laptop-sized constant, so the same
workflow asks for a few GB on the default model and for what an 8B model needs on a cluster
(SLURM's --mem; Snakemake's local scheduler ignores it unless --resources mem_mb=... is given).
A model's size comes from its config (`params_b`, billions of parameters; computed for tiny random
models), so a dry run shows the requests before anything is downloaded.
"""

from __future__ import annotations

BYTES_PER_PARAM = {"float32": 4, "bfloat16": 2, "float16": 2}
# a model whose config gives no size: about SmolLM2-360M
DEFAULT_PARAMS_B = 0.5
# Python, torch, tokenizer, task tables: present whatever the model
OVERHEAD_MB = 1500

# per rule: (floor MB, copies of the model's weights held at the peak). The floors are the peaks
# measured on SmolLM2-135M (fp32) with margin; the copies what the rule holds besides them.
RULE_MEMORY = {
    # the source and its dequantised weights, which the converted model takes over (no copy:
    # 8.8 GB for the knowledge model's 6.6 GB of float32 weights, benchmarks/prepare_memory.py)
    "prepare_model": (4000, 1.5),
    "baseline": (4000, 1.5),  # weights + activations of a batch
    "facts_formats": (4000, 1.5),
    # lm-eval keeps logits over the whole vocabulary: its batch is cut to fit what is left of
    # the request (gna.tasks.lmeval_bridge.fitting_batch_size), so half a copy of the weights
    # bounds them (the knowledge model: batch 3, 11.7 GB asked; one copy more asked for batch 6)
    "lm_eval": (4000, 1.5),
    "lm_eval_crosscheck": (4000, 1.5),
    "prune_gradual": (4000, 1.5),
    "prune_individual": (4000, 1.5),
    "heads_sweep": (4000, 1.5),
    "heads_attribution": (6000, 3.0),  # gradients of every head's output
    "heads_topk": (4000, 1.5),
    "heads_kept": (4000, 1.5),
    "case_prune": (4000, 1.5),
    "case_layers": (4000, 1.5),
    "case_sweep": (4000, 1.5),
    "case_kept": (4000, 1.5),
    "case_gna": (4000, 1.5),
    "heads_dictsize": (4000, 1.5),
    "gna_roles": (4000, 1.5),
    "gna_masking": (4000, 1.5),
    "distill_teacher": (6000, 2.0),  # teacher + its stored hidden states
    "distill_align": (8000, 3.0),  # teacher layers + SSM heads + their optimiser
    "distill_kd": (8000, 6.0),  # teacher + student + gradients + Adam's two moments
    "hybrid_score": (6000, 1.5),
    "hybrid_budget": (6000, 1.5),
    "hybrid_ablation": (8000, 6.0),  # distils the ablated student too
    "hybrid_swap": (6000, 1.5),
    "hybrid_memory": (6000, 1.5),
    "hybrid_answer_rows": (6000, 1.5),
}


def tiny_random_params_b(spec: dict) -> float:
    """Billions of parameters of a tiny random Llama config (gna.models.tiny's defaults)."""
    hidden, layers = spec.get("hidden", 64), spec.get("layers", 4)
    heads, kv_heads = spec.get("heads", 4), spec.get("kv_heads", 2)
    intermediate = spec.get("intermediate", 2 * hidden)
    kv = hidden // heads * kv_heads
    per_layer = 2 * hidden * hidden + 2 * hidden * kv + 3 * hidden * intermediate
    vocab = spec.get("vocab") or 257  # the byte-level tokenizer's
    return (layers * per_layer + 2 * vocab * hidden) / 1e9


def model_params_b(spec: dict) -> float:
    """A model spec's size in billions of parameters: its `params_b`, computed for tiny-random,
    else DEFAULT_PARAMS_B."""
    if spec.get("params_b"):
        return float(spec["params_b"])
    if spec["source"] == "tiny-random":
        return tiny_random_params_b(spec)
    return DEFAULT_PARAMS_B


def mem_mb(rule: str, params_b: float, dtype: str) -> int:
    """MB of memory for a job of `rule` on a model of `params_b` billion parameters in `dtype`:
    the rule's floor, or the overhead plus its copies of the weights when that is more."""
    if rule not in RULE_MEMORY:
        raise KeyError(f"rule {rule!r} has no memory entry in gna.core.resources.RULE_MEMORY")
    floor, copies = RULE_MEMORY[rule]
    weights_mb = params_b * 1e9 * BYTES_PER_PARAM[dtype] / 2**20
    return int(max(floor, OVERHEAD_MB + copies * weights_mb))
