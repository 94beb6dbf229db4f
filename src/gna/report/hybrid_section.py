"""Report section for the SSM / hybrid students: heads-kept and state-size tables, perplexity
figure, layer swap, inference memory, and the distillation curves."""

from __future__ import annotations

import html

import matplotlib.pyplot as plt
import polars as pl

from gna.report.htmlkit import SectionContext, pct, placeholder_figure, save_figure, table
from gna.students.spec import TEACHER_VARIANT

REFERENCE_HEADS = """
<p class='note'><b>Reference, not produced by this pipeline:</b> the study's Hybrid-Llama-1B (distilled from
Llama-3.2-1B, retrieval-guided heads kept), selected columns:</p>
<table class='ref'><thead><tr><th>attention heads kept</th><th>LAMBADA acc</th><th>MMLU</th><th>KV-Ret</th>
<th>PIQA (knowledge)</th></tr></thead><tbody>
<tr><td>0</td><td>50.7</td><td>39.2</td><td>13.2</td><td>74.2</td></tr>
<tr><td>10</td><td>54.2</td><td>42.1</td><td>99.0</td><td>74.6</td></tr>
<tr><td>20</td><td>55.0</td><td>43.0</td><td>99.3</td><td>74.5</td></tr>
<tr><td>40</td><td>54.0</td><td>44.0</td><td>99.4</td><td>73.7</td></tr>
<tr><td>512 (Llama-3.2-1B)</td><td>60.1</td><td>46.0</td><td>99.3</td><td>74.4</td></tr></tbody></table>
"""

REFERENCE_STATE = """
<p class='note'><b>Reference, not produced by this pipeline:</b> the study's state-size table (Hybrid-Llama-1B,
20 heads kept):</p>
<table class='ref'><thead><tr><th>state size</th><th>MMLU</th><th>KV-Ret</th><th>PIQA (knowledge)</th></tr></thead>
<tbody><tr><td>4</td><td>37.0</td><td>72.6</td><td>74.6</td></tr><tr><td>8</td><td>41.0</td><td>90.0</td><td>74.0</td></tr>
<tr><td>64</td><td>43.0</td><td>99.3</td><td>74.5</td></tr></tbody></table>
"""

REFERENCE_MEMORY = """
<p class='note'><b>Reference, not produced by this pipeline:</b> the study's inference memory (1B models):
Hybrid-Llamba 1.2 / 11.0 / 21.5 MB and Llama-3.2-1B 4.2 / 67.1 / 134.2 MB at L = 128 / 2048 / 4096.
Its layer swap: replacing layer 17 of the aligned Llamba by attention raised MMLU from 33% to 50%
(knowledge unchanged at 69%).</p>
"""


def _metric_table(scores: pl.DataFrame, label_col: str) -> pl.DataFrame:
    """One row per variant: KV accuracy per dictionary size and overall, MMLU, perplexity."""
    acc = scores.filter(pl.col("metric") == "acc")
    sizes = sorted({int(g) for g in acc.filter((pl.col("task") == "kv_retrieval") & (pl.col("group") != "all"))["group"]})
    rows = []
    for key in scores[label_col].unique(maintain_order=True):
        sub = scores.filter(pl.col(label_col) == key)

        def value(task, group="all", metric="acc"):
            hit = sub.filter((pl.col("task") == task) & (pl.col("group") == group) & (pl.col("metric") == metric))
            return hit["value"][0] if len(hit) else None

        row = {label_col: key}
        for size in sizes:
            row[f"KV {size} keys"] = value("kv_retrieval", str(size))
        row["KV all"] = value("kv_retrieval")
        row["MMLU letter (retrieval-heavy)"] = value("mmlu_letter")
        row["MMLU cloze (knowledge)"] = value("mmlu_cloze")
        row["held-out perplexity"] = value("heldout", metric="perplexity")
        rows.append(row)
    return pl.DataFrame(rows)


def _fmt(frame: pl.DataFrame) -> dict:
    out = {c: pct for c in frame.columns if c.startswith(("KV", "MMLU"))}
    out["held-out perplexity"] = lambda v: f"{v:.1f}"
    return out


def plot_heads(frame: pl.DataFrame, teacher: dict, path) -> None:
    fig, (ax_ppl, ax_kv) = plt.subplots(1, 2, figsize=(11, 4))
    ks = frame["heads kept"].to_list()
    ax_ppl.plot(ks, frame["held-out perplexity"], "o-", color="tab:purple", label="student")
    if teacher.get("held-out perplexity"):
        ax_ppl.axhline(teacher["held-out perplexity"], ls="--", color="gray", label="teacher")
    ax_ppl.set(xlabel="attention heads kept (top of the ranking)", ylabel="held-out perplexity", yscale="log",
               title="perplexity vs heads kept")
    ax_ppl.legend()
    for col in [c for c in frame.columns if c.startswith("KV")]:
        ax_kv.plot(ks, frame[col], "o-", label=col.replace("KV ", ""), lw=2.5 if col == "KV all" else 1)
    ax_kv.plot(ks, frame["MMLU cloze (knowledge)"], "s:", color="black", label="MMLU cloze")
    ax_kv.set(xlabel="attention heads kept (top of the ranking)", ylabel="accuracy", ylim=(-0.02, 1.02),
              title="KV-retrieval vs heads kept")
    ax_kv.legend(fontsize=8)
    save_figure(fig, path)


def plot_training(align: pl.DataFrame, kd: pl.DataFrame, path) -> None:
    fig, (ax_a, ax_k) = plt.subplots(1, 2, figsize=(11, 3.8))
    if not align.is_empty():
        for n in sorted(align["state_size"].unique()):
            sub = align.filter(pl.col("state_size") == n).group_by("step").agg(pl.col("loss").mean()).sort("step")
            ax_a.plot(sub["step"], sub["loss"], label=f"N = {n}")
        ax_a.set(xlabel="alignment step", ylabel="relative error (mean over layers)", yscale="log",
                 title="stage 1: layer-local alignment")
        ax_a.legend()
    if not kd.is_empty():
        for (k, n), sub in kd.sort("step").group_by(["heads_kept", "state_size"], maintain_order=True):
            ax_k.plot(sub["step"], sub["loss"], label=f"k={k}, N={n}")
        ax_k.set(xlabel="distillation step", ylabel="cross-entropy to teacher top-k", title="stage 2: distillation")
        ax_k.legend(fontsize=8)
    save_figure(fig, path)


def _bytes(v) -> str:
    if v is None:
        return "–"
    return f"{v / 2**20:.2f} MB" if v >= 2**20 else f"{v / 2**10:.1f} KB"


DESIGN = (
    "<h2>SSM and hybrid students</h2>"
    "<p>No SSM weights are reachable offline, so the pipeline distills its own from each model. "
    "<b>Design: head-wise replacement.</b> Every attention head of the teacher is either kept (its own "
    "q/k/v/o weights) or replaced by an SSM head — a discrete Mamba-2 style selective scan with state "
    "size N, initialised from the head (C←Q, B←K, x←V of its K/V group), whose output enters the "
    "teacher's shared o_proj in the head's place. The top-k heads of the per-head ablation ranking are "
    "kept; k = 0 is a pure SSM with the teacher's MLPs. We chose head-wise replacement over a full SSM "
    "beside the kept heads because it keeps every head's identity: the same ranking, ablation and "
    "Gather-and-Aggregate tools apply to teacher and student head by head, and the KV cache shrinks "
    "exactly with the heads removed. Stage 1 aligns every SSM head, given the teacher's hidden state "
    "entering its layer, to its attention head's contribution to the residual stream (once per state "
    "size, shared by all heads-kept variants); stage 2 distills each variant end to end on the "
    "teacher's next-token distributions. Only SSM parameters are trained.</p>")


def budget_note(hy: dict) -> str:
    """The training and evaluation budget of this run's students."""
    corpus = hy["corpus"]
    return (f"<p class='note'>Budget of this run: {corpus['train_windows']} training windows of "
            f"{corpus['seq_len']} tokens (answered MMLU questions outside the evaluation subset and "
            f"synthetic KV prompts), alignment {hy['align']['steps']} steps × {hy['align']['batch']} windows, "
            f"distillation {hy['kd']['steps']} steps × {hy['kd']['batch']} windows; "
            f"{hy['eval_items']} items per task; perplexity on {corpus['heldout_windows']} held-out windows. "
            "These are CPU-minute students: compare them with each other, not with published models.</p>")


def heads_kept_part(model: str, teacher: pl.DataFrame, heads_table: pl.DataFrame, hy: dict) -> str:
    """The teacher beside the heads-kept sweep at the configured state size."""
    shown = pl.concat([teacher.rename({"variant": "heads kept"}).with_columns(pl.lit("all (teacher)").alias("heads kept")),
                       heads_table.with_columns(pl.col("heads kept").cast(pl.String))], how="vertical_relaxed")
    return (f"<h3>{html.escape(model)}: attention heads kept vs knowledge / retrieval-heavy "
            f"(state size {hy['state_size']})</h3>" + table(shown, left=("heads kept",), fmt=_fmt(shown)))


def heads_kept_summary(teacher_row: dict, heads_table: pl.DataFrame) -> str:
    """KV accuracy and perplexity of the teacher, the pure SSM and the student keeping the most heads."""
    k0 = heads_table.filter(pl.col("heads kept") == 0)
    best = heads_table.sort("heads kept").tail(1)
    if not (len(k0) and len(best) and teacher_row):
        return ""
    return (f"<p>KV-retrieval (all sizes): teacher {pct(teacher_row['KV all'])}, pure SSM (k = 0) "
            f"{pct(k0['KV all'][0])}, k = {best['heads kept'][0]} {pct(best['KV all'][0])}; held-out perplexity "
            f"{teacher_row['held-out perplexity']:.1f} / {k0['held-out perplexity'][0]:.1f} / "
            f"{best['held-out perplexity'][0]:.1f}.</p>")


def state_size_part(model: str, students: pl.DataFrame, hy: dict) -> str:
    state = students.filter(pl.col("heads_kept") == hy["state_sweep_heads_kept"]).sort("state_size")
    if state["state_size"].n_unique() <= 1:
        return ""
    st = _metric_table(state, "state_size").rename({"state_size": "state size"})
    return (f"<h3>{html.escape(model)}: state size ({hy['state_sweep_heads_kept']} attention heads kept)</h3>"
            + table(st, fmt=_fmt(st)))


def swap_part(model: str, swap: pl.DataFrame, students: pl.DataFrame, teacher: pl.DataFrame, hy: dict) -> str:
    """The pure SSM, the same with the critical layer as attention again, and the teacher."""
    sw = swap.filter(pl.col("model") == model) if not swap.is_empty() else swap
    if sw.is_empty():
        return ""
    pure = students.filter((pl.col("heads_kept") == 0) & (pl.col("state_size") == hy["state_size"]))
    rows = pl.concat([_metric_table(pure, "variant"), _metric_table(sw, "variant"),
                      teacher.with_columns(pl.lit(TEACHER_VARIANT).alias("variant"))], how="vertical_relaxed")
    return (f"<h3>{html.escape(model)}: layer swap</h3>"
            f"<p>The pure SSM with the critical layer — layer {sw['swapped_layer'][0]}, home of the "
            "top-ranked head — run as the teacher's attention again (all its heads), nothing "
            "retrained.</p>" + table(rows, left=("variant",), fmt=_fmt(rows)))


def model_part(model: str, scores: pl.DataFrame, swap: pl.DataFrame, hy: dict, ctx: SectionContext | None) -> str:
    """One teacher's students: heads-kept table (and, for `ctx`, the figure), summary, state sizes, swap."""
    sub = scores.filter(pl.col("model") == model)
    teacher = _metric_table(sub.filter(pl.col("variant") == TEACHER_VARIANT), "variant")
    teacher_row = teacher.to_dicts()[0] if len(teacher) else {}
    students = sub.filter(pl.col("variant") != TEACHER_VARIANT)
    heads = students.filter(pl.col("state_size") == hy["state_size"])
    heads_table = _metric_table(heads.sort("heads_kept"), "heads_kept").rename({"heads_kept": "heads kept"})
    figure = ""
    if ctx is not None:
        plot_heads(heads_table, teacher_row, ctx.figures["hybrid_heads"])
        figure = ctx.figure("hybrid_heads")
    return (heads_kept_part(model, teacher, heads_table, hy) + figure + heads_kept_summary(teacher_row, heads_table)
            + state_size_part(model, students, hy) + swap_part(model, swap, students, teacher, hy))


def answer_rows_part(answer_rows: pl.DataFrame) -> str:
    if answer_rows.is_empty():
        return ""
    wide = (answer_rows.pivot(on="condition", index=["model", "variant", "attention_heads", "task"], values="acc")
            .sort("model", "attention_heads", "task"))
    return ("<h3>Aggregation lives in attention: answer rows of the attention heads masked</h3>"
            "<p>In each hybrid, every attention head's answer rows (the last context token and the choice "
            "tokens) are masked to see only themselves; SSM heads are untouched. The study (Zamba2): "
            "retrieval-heavy tasks drop sharply, knowledge tasks stay.</p>"
            + table(wide, left=("model", "variant", "task"),
                    fmt={c: pct for c in wide.columns if c not in ("model", "variant", "task", "attention_heads")}))


def memory_table(sub: pl.DataFrame) -> str:
    """Bytes per variant and sequence length, and the ratio to the teacher at the longest."""
    wide = sub.select("variant", "seq_len", "total_bytes").pivot(on="seq_len", index="variant", values="total_bytes")
    lens = [c for c in wide.columns if c != "variant"]
    teacher_bytes = wide.filter(pl.col("variant") == TEACHER_VARIANT)
    out = wide.select("variant", *[pl.col(c).alias(f"L = {c}") for c in lens])
    if len(teacher_bytes):
        out = out.with_columns(
            [(pl.col(f"L = {c}") / teacher_bytes[c][0]).alias(f"× teacher (L = {c})") for c in lens[-1:]])
    fmts = {f"L = {c}": _bytes for c in lens}
    fmts.update({c: (lambda v: f"{v:.2f}") for c in out.columns if c.startswith("×")})
    return table(out, left=("variant",), fmt=fmts)


def memory_part(memory: pl.DataFrame, hy: dict, reference: bool) -> str:
    """Per model: the inference-memory formula table and its measured check."""
    if memory.is_empty():
        return ""
    parts = []
    formula = memory.filter(pl.col("source") == "formula")
    for model in sorted(formula["model"].unique()):
        parts.append(f"<h3>{html.escape(model)}: inference memory (KV cache + SSM state)</h3>"
                     f"<p>Computed from each configuration for one sequence at "
                     f"{hy['memory']['bytes_per_value']} bytes per value: K/V of every group with a kept "
                     "head, and an N×P state per SSM head.</p>")
        parts.append(memory_table(formula.filter(pl.col("model") == model)))
        measured = memory.filter((pl.col("source") == "measured") & (pl.col("model") == model))
        for row in measured.iter_rows(named=True):
            parts.append(f"<p>Measured check: after a prefill of {row['seq_len']} tokens the recurrent cache of "
                         f"<code>{html.escape(row['variant'])}</code> held {row['total_bytes']:,} bytes (fp32 "
                         f"tensors); the formula gives {row['formula_bytes']:,}.</p>")
    if reference:
        parts.append(REFERENCE_MEMORY)
    return "".join(parts)


def render_hybrid(ctx: SectionContext) -> str:
    """The students: heads kept, state size, layer swap, answer rows, memory and training curves
    (placeholder figures when the hybrid phase is off)."""
    if not ctx.paths("hybrid_scores"):
        for name in ("hybrid_heads", "hybrid_training"):
            placeholder_figure(ctx.figures[name], "hybrid phase not run (hybrid.enabled: false)")
        return ""
    hy, scores, swap = ctx.config["hybrid"], ctx.frame("hybrid_scores"), ctx.frame("hybrid_swap")
    parts = [DESIGN, budget_note(hy)]
    if scores.is_empty():
        return "".join(parts)
    models = sorted(scores["model"].unique())
    parts += [model_part(model, scores, swap, hy, ctx if model == models[0] else None) for model in models]
    parts.append(answer_rows_part(ctx.frame("hybrid_answer_rows")))
    if ctx.show_reference:
        parts += [REFERENCE_HEADS, REFERENCE_STATE]
    parts.append(memory_part(ctx.frame("hybrid_memory"), hy, ctx.show_reference))
    plot_training(ctx.frame("hybrid_align"), ctx.frame("hybrid_kd"), ctx.figures["hybrid_training"])
    parts.append(ctx.figure("hybrid_training"))
    return "".join(parts)
