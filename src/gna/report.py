"""The HTML report: tables and figures regenerated from Parquet results, with provenance.

Self-contained (figures embedded as base64 PNG) so the single file can be mailed or archived.
"""

from __future__ import annotations

import datetime as dt
import html
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import polars as pl  # noqa: E402
import seaborn as sns  # noqa: E402
import yaml  # noqa: E402

from gna.htmlkit import CSS, accuracy_axis, dict_size_axis, embed, pct, placeholder_figure, save_figure, table  # noqa: E402
from gna.io import read_parquet, write_text  # noqa: E402
from gna.models import read_provenance  # noqa: E402
from gna.provenance import config_hash, git_commit, machine  # noqa: E402

def plot_kv(baseline: pl.DataFrame, path: str | Path) -> None:
    kv = baseline.filter((pl.col("task") == "kv_retrieval") & (pl.col("metric") == "acc") & (pl.col("group") != "all"))
    kv = kv.with_columns(pl.col("group").cast(pl.Int64).alias("dict_size")).sort("dict_size")
    fig, ax = plt.subplots(figsize=(6, 3.8))
    if not kv.is_empty():
        sns.lineplot(data=kv.to_pandas(), x="dict_size", y="value", hue="model", marker="o", ax=ax)
        dict_size_axis(ax, kv["dict_size"].unique().sort().to_list())
    title = f"KV-retrieval ({kv['format'][0]} template)" if not kv.is_empty() else "KV-retrieval"
    accuracy_axis(ax, title, "dictionary size (keys)")
    save_figure(fig, path)


def plot_mmlu(baseline: pl.DataFrame, path: str | Path) -> None:
    mm = baseline.filter(pl.col("task").str.starts_with("mmlu_") & (pl.col("metric") == "acc") & (pl.col("group") == "all"))
    fig, ax = plt.subplots(figsize=(6, 3.8))
    if not mm.is_empty():
        sns.barplot(data=mm.to_pandas(), x="model", y="value", hue="format", ax=ax)
        ax.axhline(0.25, ls="--", color="grey", label="chance")
    ax.set_ylabel("accuracy")
    ax.set_ylim(0, 1)
    ax.set_title("MMLU: letter vs cloze on the same questions")
    ax.legend(fontsize=8)
    save_figure(fig, path)


def _timings(benchmark_dir: str | Path) -> pl.DataFrame:
    rows = []
    for tsv in sorted(Path(benchmark_dir).rglob("*.tsv")):
        frame = pl.read_csv(tsv, separator="\t")
        rows.append({"step": str(tsv.relative_to(benchmark_dir).with_suffix("")),
                     "seconds": float(frame["s"][0]), "peak RSS (MB)": float(frame["max_rss"][0])})
    return pl.DataFrame(rows, schema={"step": pl.String, "seconds": pl.Float64, "peak RSS (MB)": pl.Float64})


def _model_rows(model_dirs: list[str]) -> pl.DataFrame:
    rows = []
    for folder in model_dirs:
        info = read_provenance(folder)
        spec = info.get("spec", {})
        source = {
            "pypi-file": lambda s: f"PyPI {s['package']}=={s['version']} : {s['member']}",
            "hf": lambda s: f"HF {s['id']}" + (f"@{s['revision']}" if s.get("revision") else ""),
            "local": lambda s: f"local {s['path']}",
            "tiny-random": lambda s: f"tiny random {s.get('arch', 'llama')} (seed {s.get('seed', 0)})",
        }.get(spec.get("source"), lambda s: "?")(spec)
        rows.append({"model": info.get("name", Path(folder).name), "source": source,
                     "sha256": (info.get("raw_file_sha256") or "–"), "architecture": info.get("architecture"),
                     "layers": info.get("n_layers"), "params (M)": round(info.get("n_params", 0) / 1e6, 1),
                     "convert s": info.get("seconds")})
    return pl.DataFrame(rows)


def _baseline_sections(baseline: pl.DataFrame, kv_task: pl.DataFrame, figures: dict) -> str:
    ours = baseline.filter(pl.col("engine") == "gna")
    parts = []
    overall = (ours.filter(pl.col("group") == "all")
               .pivot(on="metric", index=["model", "task", "format", "n", "chance"], values="value")
               .sort(["model", "task"]))
    cols = [c for c in ["model", "task", "format", "n", "acc", "acc_norm", "greedy_exact_match", "chance"] if c in overall.columns]
    parts.append("<h2>Baseline</h2>")
    parts.append("<p>Every model scored on every task by the gna engine (log-likelihood of each choice; "
                 "<i>acc</i> = argmax of the summed log-prob, <i>acc_norm</i> = normalised by the choice's bytes, "
                 "<i>greedy_exact_match</i> = greedy decoding reproduces the target).</p>")
    parts.append(table(overall.select(cols), left=("model", "task", "format"),
                        fmt={c: pct for c in ("acc", "acc_norm", "greedy_exact_match", "chance")}))

    template = kv_task["template"][0]
    kv = ours.filter((pl.col("task") == "kv_retrieval") & (pl.col("group") != "all") & (pl.col("metric") == "acc"))
    kv_wide = (kv.with_columns(pl.col("group").cast(pl.Int64).alias("dict size"))
               .pivot(on="model", index=["dict size", "n", "chance"], values="value").sort("dict size"))
    example = html.escape(kv_task.filter(pl.col("dict_size") == kv_task["dict_size"].min())["context"][0])
    parts.append("<h3>KV-retrieval by dictionary size</h3>")
    parts.append(f"<p class='note'>Template: <b>{template}</b>. Example prompt (smallest dictionary):</p>"
                 f"<pre>{example}</pre>")
    parts.append(table(kv_wide, fmt={c: pct for c in kv_wide.columns if c not in ("dict size", "n")}))
    parts.append(embed(figures["kv"], "KV-retrieval accuracy vs dictionary size (chance dashed). "
                        f"Template <b>{template}</b>; the predicted value is the argmax of summed log-prob "
                        "over the dictionary's values."))

    mm = ours.filter(pl.col("task").str.starts_with("mmlu_") & (pl.col("group") == "all") & (pl.col("metric") == "acc"))
    if not mm.is_empty():
        parts.append("<h3>MMLU: letter vs cloze</h3>")
        findings = []
        for model in mm["model"].unique().sort():
            sub = {r["format"]: r for r in mm.filter(pl.col("model") == model).iter_rows(named=True)}
            if {"letter", "cloze"} <= sub.keys():
                findings.append(
                    f"<li><b>{html.escape(model)}</b>: letter format {pct(sub['letter']['value'])} vs cloze "
                    f"{pct(sub['cloze']['value'])} on the same {sub['letter']['n']} questions (chance 25%). "
                    + ("Letter accuracy is near chance while cloze is above it: the model has some of the "
                       "knowledge but cannot retrieve the option letter in context."
                       if sub["letter"]["value"] < 0.32 and sub["cloze"]["value"] > sub["letter"]["value"] + 0.05
                       else "") + "</li>")
        parts.append("<ul>" + "".join(findings) + "</ul>")
        parts.append(embed(figures["mmlu"], "MMLU accuracy in letter format (retrieve the option letter) and "
                            "cloze format (log-likelihood of the answer text) on the same questions; chance dashed. "
                            "The study's format finding: the letter format demands in-context retrieval."))
    lm = baseline.filter(pl.col("engine") == "lm-eval")
    cross = lm.filter((pl.col("task") == "gna_mmlu_letter") & (pl.col("metric") == "acc"))
    if not cross.is_empty():
        ours_letter = mm.filter(pl.col("format") == "letter").select("model", pl.col("value").alias("gna engine"),
                                                                     pl.col("n").alias("n (gna)"))
        check = cross.select("model", pl.col("value").alias("lm-eval"), pl.col("n").alias("n (lm-eval)")).join(
            ours_letter, on="model", how="left")
        parts.append("<h3>Cross-check with lm-evaluation-harness</h3>")
        parts.append("<p>The same MMLU letter items, 0-shot, scored by lm-eval's HFLM on the same model: the two "
                     "engines should agree exactly (they differ only if the config asks for few-shot prompts, "
                     "which lm-eval samples differently).</p>")
        parts.append(table(check, left=("model",), fmt={"lm-eval": pct, "gna engine": pct}))
        lm = lm.filter(pl.col("task") != "gna_mmlu_letter")
    if not lm.is_empty():
        parts.append("<h3>lm-evaluation-harness tasks</h3>")
        keep = [c for c in ["model", "task", "metric", "value", "stderr", "n"] if c in lm.columns]
        parts.append(table(lm.select(keep).sort(["model", "task", "metric"]), left=("model", "task", "metric")))
    return "\n".join(parts)


REFERENCE = """
<p class='note'><b>Reference, not produced by this pipeline:</b> the study's published table (Bick, Xing, Gu,
ICML 2025) for Llama-3.1-8B-Instruct pruned above layer 17, heads kept in layers 16/17:</p>
<table class='ref'><thead><tr><th>heads kept L16</th><th>heads kept L17</th><th>MMLU (reference)</th>
<th>knowledge tasks (reference)</th></tr></thead><tbody>
<tr><td>22</td><td>24</td><td>66.32%</td><td>39.09%</td></tr>
<tr><td>∅</td><td>24</td><td>24.36%</td><td>39.18%</td></tr>
<tr><td>22</td><td>∅</td><td>25.59%</td><td>39.21%</td></tr>
<tr><td>∅</td><td>∅</td><td>25.56%</td><td>39.21%</td></tr></tbody></table>
"""


def _concat(paths) -> pl.DataFrame:
    frames = [read_parquet(p) for p in paths]
    return pl.concat(frames, how="diagonal_relaxed") if frames else pl.DataFrame()


def build_report(inputs: dict, html_path, figures: dict, options: dict, config: dict, benchmark_dir,
                 workflow_dir) -> None:
    """inputs: baseline, kv_task, models (folders), and per-model lists prune_gradual,
    prune_individual, prune_minimal (empty lists skip that section)."""
    import json

    from gna.report_prune import prune_section

    baseline = read_parquet(inputs["baseline"])
    kv_task = read_parquet(inputs["kv_task"])
    model_dirs = inputs["models"]
    plot_kv(baseline, figures["kv"])
    plot_mmlu(baseline, figures["mmlu"])
    models = _model_rows(model_dirs)
    timings = _timings(benchmark_dir)
    mach = machine()
    prov = {
        "generated": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "git commit": git_commit(workflow_dir),
        "config hash": config_hash(config),
        "python / torch": f"{mach['python']} / {mach['torch']}",
        "machine": f"{mach['platform']}, {mach['cpu_count']} CPUs, CUDA {'yes' if mach['cuda'] else 'no'}",
    }
    body = [f"<h1>{html.escape(options['title'])}</h1>",
            "<p>Regenerated from the pipeline's Parquet results; every number below was computed by this run "
            "unless it sits in a table labelled <i>reference</i>.</p>",
            table(pl.DataFrame({"item": list(prov), "value": list(prov.values())}), left=("item", "value")),
            "<h2>Models</h2>",
            table(models, left=("model", "source", "sha256", "architecture")),
            _baseline_sections(baseline, kv_task, figures)]
    if inputs.get("prune_gradual"):
        minimal = [json.loads(open(p).read()) for p in inputs.get("prune_minimal", [])]
        body.append(prune_section(_concat(inputs["prune_gradual"]), _concat(inputs.get("prune_individual", [])),
                                  minimal, figures))
    if inputs.get("gna_roles"):
        from gna.report_gna import gna_section

        gna_part = gna_section(_concat(inputs["gna_roles"]), _concat(inputs["gna_maps"]), figures,
                               _concat(inputs.get("gna_masking", [])))
    else:
        gna_part = ""
    if inputs.get("heads_ranking"):
        from gna.report_heads import heads_section

        body.append(heads_section(_concat(inputs["heads_ranking"]), _concat(inputs.get("heads_topk", [])),
                                  _concat(inputs.get("heads_kept", [])), _concat(inputs.get("heads_dictsize", [])),
                                  _concat(inputs.get("heads_attribution", [])), _concat(inputs["heads_sweep"]), figures,
                                  reference=REFERENCE if options.get("show_reference", True) else ""))
    body.append(gna_part)
    if inputs.get("hybrid_scores"):
        from gna.report_hybrid import hybrid_section

        body.append(hybrid_section(_concat(inputs["hybrid_scores"]), _concat(inputs.get("hybrid_swap", [])),
                                   _concat(inputs.get("hybrid_memory", [])), _concat(inputs.get("hybrid_align", [])),
                                   _concat(inputs.get("hybrid_kd", [])), config["hybrid"], figures,
                                   reference=options.get("show_reference", True),
                                   answer_rows=_concat(inputs.get("hybrid_answer_rows", []))))
    else:
        for key in ("hybrid_heads", "hybrid_training"):
            if key in figures:
                placeholder_figure(figures[key], "hybrid phase not run (hybrid.enabled: false)")
    if not timings.is_empty():
        body.append("<h2>Timings</h2><p>Wall time and peak memory of each step (Snakemake benchmark records).</p>")
        body.append(table(timings, left=("step",), fmt={"seconds": lambda v: f"{v:.1f}", "peak RSS (MB)": lambda v: f"{v:.0f}"}))
    body.append("<h2>Config</h2><details><summary>the validated config of this run</summary><pre>"
                + html.escape(yaml.safe_dump(config, sort_keys=False)) + "</pre></details>")
    page = (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(options['title'])}</title>"
            f"<style>{CSS}</style></head><body>{''.join(body)}</body></html>")
    write_text(page, html_path)
