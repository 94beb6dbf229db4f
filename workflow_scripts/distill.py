"""Distillation rules: teacher activations, alignment per state size, KD per variant, scoring
(variants, teacher, layer swap) and the inference-memory table."""
import re
import time

import polars as pl
import torch
from safetensors.torch import load_file, save_file

from gna.io import atomic_dir, atomic_path, read_parquet, write_parquet
from gna.models import load_model
from gna.runtime import peak_rss_mb, setup

log = setup(snakemake.log[0], snakemake.threads)
p = snakemake.params
model_name = snakemake.wildcards.model
start = time.perf_counter()


def heldout_ids():
    from safetensors import safe_open

    with safe_open(snakemake.input.teacher, "pt") as f:
        return f.get_tensor("heldout_ids")


def task_tables():
    from gna.tasks import subset_evenly as sweep_subset

    tables = {}
    for path in snakemake.input.tasks:
        table = sweep_subset(read_parquet(path), p.max_items)
        tables[table["task"][0]] = table
    return tables


def ranked_heads(model, k):
    ranking = read_parquet(snakemake.input.ranking).sort("rank")
    if k > len(ranking):
        raise ValueError(f"hybrid.heads_kept: {k} heads asked, but {model_name} has only {len(ranking)} ranked heads")
    return [(int(a), int(b)) for a, b in ranking.select("layer", "head").head(k).iter_rows()]


if snakemake.rule == "distill_teacher":
    from gna.distill import build_corpus, teacher_activations
    from gna.tasks import load_mmlu_jsonl, select_mmlu

    model, tok = load_model(snakemake.input.model, p.dtype)
    mmlu = p.mmlu
    _, pool = select_mmlu(load_mmlu_jsonl(snakemake.input.mmlu), mmlu["n"], mmlu["seed"], mmlu["topics"])
    corpus = build_corpus(tok, pool, p.corpus, p.template, p.seed)
    log.info("corpus: %d train and %d held-out windows of %d tokens (%d MMLU questions outside the evaluation subset)",
             len(corpus["train"]), len(corpus["heldout"]), p.corpus["seq_len"], len(pool))
    acts = teacher_activations(model, corpus["train"], p.top_k)
    tensors = {"hidden": acts["hidden"], "top_logp": acts["top_logp"], "top_idx": acts["top_idx"],
               "train_ids": corpus["train"], "heldout_ids": corpus["heldout"]}
    with atomic_path(snakemake.output[0]) as tmp:
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp))
    log.info("teacher hidden states %s (float16)", tuple(acts["hidden"].shape))

elif snakemake.rule == "distill_align":
    from gna.distill import align_layers

    n = int(snakemake.wildcards.n)
    model, _ = load_model(snakemake.input.model, p.dtype)
    hidden = load_file(snakemake.input.teacher)["hidden"]
    a = p.align
    state, curve = align_layers(model, hidden, n, a["steps"], a["batch"], a["lr"], p.seed)
    with atomic_path(snakemake.output.weights) as tmp:
        save_file({k: v.contiguous() for k, v in state.items()}, str(tmp))
    write_parquet(curve.with_columns(pl.lit(model_name).alias("model"), pl.lit(n).alias("state_size")),
                  snakemake.output.curve)
    if not curve.is_empty():
        last = curve.filter(pl.col("step") == curve["step"].max())
        log.info("n=%d: mean relative error of the SSM heads after alignment %.3f", n, last["loss"].mean())

elif snakemake.rule == "distill_kd":
    import copy

    from gna.distill import distill_logits, load_aligned
    from gna.hybrid import hybrid_spec, make_hybrid, save_student

    k, n = int(snakemake.wildcards.k), int(snakemake.wildcards.n)
    teacher, tok = load_model(snakemake.input.model, p.dtype)
    kept = ranked_heads(teacher, k)
    student = load_aligned(make_hybrid(copy.deepcopy(teacher), kept, n), load_file(snakemake.input.aligned))
    data = load_file(snakemake.input.teacher)
    kd = p.kd
    curve = distill_logits(student, data["train_ids"], data["top_logp"], data["top_idx"], kd["steps"], kd["batch"],
                           kd["lr"], p.seed, desc=f"kd k={k} n={n}")
    spec = hybrid_spec(student, teacher=model_name, heads_kept=k, variant=f"k{k}-n{n}",
                       kept_ranked=[list(h) for h in kept])
    with atomic_dir(snakemake.output.student) as tmp:
        save_student(student, tok, tmp, spec)
    write_parquet(curve.with_columns(pl.lit(model_name).alias("model"), pl.lit(k).alias("heads_kept"),
                                     pl.lit(n).alias("state_size")), snakemake.output.curve)

elif snakemake.rule in ("hybrid_score", "hybrid_swap"):
    from gna.hybrid import swapped_to_attention
    from gna.evaluation import score_model

    model, tok = load_model(snakemake.input.model, p.dtype)
    tables, heldout = task_tables(), heldout_ids()
    if snakemake.rule == "hybrid_score":
        variant = snakemake.wildcards.variant
        frame = score_model(model, tok, tables, heldout, p.batch_size)
        match = re.fullmatch(r"k(\d+)-n(\d+)", variant)
        k, n = (int(match[1]), int(match[2])) if match else (None, None)
        frame = frame.with_columns(pl.lit(variant).alias("variant"), pl.lit(k, pl.Int64).alias("heads_kept"),
                                   pl.lit(n, pl.Int64).alias("state_size"))
    else:
        critical = ranked_heads(model, 1)[0][0]  # the top head's layer
        with swapped_to_attention(model, [critical]):
            frame = score_model(model, tok, tables, heldout, p.batch_size)
        frame = frame.with_columns(pl.lit(f"{snakemake.input.model.rsplit('-hybrid-', 1)[1]} + attention layer {critical}")
                                   .alias("variant"), pl.lit(critical).alias("swapped_layer"))
    write_parquet(frame.with_columns(pl.lit(model_name).alias("model")), snakemake.output[0])
    for row in frame.filter(pl.col("group") == "all").filter(pl.col("metric").is_in(["acc", "perplexity"])).iter_rows(named=True):
        log.info("%s %s %s: %.3f", row["variant"], row["task"], row["metric"], row["value"])

elif snakemake.rule == "hybrid_answer_rows":
    from gna.masking import answer_rows_experiment

    model, tok = load_model(snakemake.input.model, p.dtype)
    frame = answer_rows_experiment(model, task_tables(), tok, p.batch_size)
    for row in frame.iter_rows(named=True):
        log.info("%s %s: acc %.3f", row["task"], row["condition"], row["acc"])
    write_parquet(frame.with_columns(pl.lit(model_name).alias("model"),
                                     pl.lit(snakemake.wildcards.variant).alias("variant")), snakemake.output[0])

elif snakemake.rule == "hybrid_memory":
    import json
    from pathlib import Path

    from gna.hybrid_eval import measured_cache, memory_rows
    from gna.hybrid import load_student

    m = p.memory
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(snakemake.input.model)
    rows = memory_rows("teacher", cfg, None, 0, m["seq_lens"], m["bytes_per_value"])
    specs = {}
    for folder in snakemake.input.students:
        spec = json.loads((Path(folder) / "gna_hybrid.json").read_text())
        specs[folder] = spec
        rows += memory_rows(spec["variant"], cfg, spec["kept_heads"], spec["state_size"], m["seq_lens"],
                            m["bytes_per_value"])
    frame = pl.DataFrame(rows).with_columns(pl.lit("formula").alias("source"))
    # measured check: the student with the most attention heads (largest KV cache), fp32 as loaded
    folder = max(specs, key=lambda f: (len(specs[f]["kept_heads"]), specs[f]["state_size"]))
    student, _ = load_student(folder)
    measured = measured_cache(student, m["check_len"])
    expected = memory_rows(specs[folder]["variant"], cfg, specs[folder]["kept_heads"], specs[folder]["state_size"],
                           [m["check_len"]], torch.finfo(next(student.parameters()).dtype).bits // 8)[0]
    log.info("measured cache of %s at %d tokens: %d bytes (formula %d)", specs[folder]["variant"], m["check_len"],
             measured, expected["total_bytes"])
    check = pl.DataFrame([{**expected, "source": "measured", "total_bytes": measured,
                           "kv_cache_bytes": None, "ssm_state_bytes": None, "formula_bytes": expected["total_bytes"]}])
    frame = pl.concat([frame, check], how="diagonal_relaxed")
    write_parquet(frame.with_columns(pl.lit(model_name).alias("model")), snakemake.output[0])

log.info("done in %.1f s, peak RSS %.0f MB", time.perf_counter() - start, peak_rss_mb())
