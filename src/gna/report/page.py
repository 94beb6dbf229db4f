"""The HTML report: tables and figures regenerated from Parquet results, with provenance.

Self-contained (figures embedded as base64 PNG) so the single file can be mailed or archived.
The sections, their inputs, figures and captions come from gna.report.registry, which the
report rule reads too.
"""

from __future__ import annotations

import datetime as dt
import html
from pathlib import Path

import polars as pl
import yaml

from gna.report import baseline_section, gna_section, heads_section, hybrid_section, prune_section
from gna.report.htmlkit import CSS, SectionContext, read_caption, table
from gna.core.io import write_text
from gna.core.provenance import config_hash, git_commit, machine
from gna.report.registry import FIGURES, SECTIONS, Section

# the sections' render modules, imported (not looked up by name) so that the report rule's code
# fingerprint covers them: a section whose module is missing here fails instead of going unhashed
RENDER_MODULES = {module.__name__: module for module in (baseline_section, gna_section, heads_section, hybrid_section,
                                                         prune_section)}


def render_function(section: Section):
    """The section's render function, from its 'module:function' name."""
    module, name = section.render.split(":")
    return getattr(RENDER_MODULES[module], name)


def captions(workflow_dir: str | Path) -> dict[str, str]:
    """{figure name: caption HTML}, read from the workflow's rules/captions/<figure>.rst."""
    return {figure.name: read_caption(Path(workflow_dir) / figure.caption_file) for figure in FIGURES}


def timings(benchmark_dir: str | Path) -> pl.DataFrame:
    """Wall time and peak memory of each step, from Snakemake's benchmark records."""
    rows = []
    for tsv in sorted(Path(benchmark_dir).rglob("*.tsv")):
        frame = pl.read_csv(tsv, separator="\t")
        rows.append({"step": str(tsv.relative_to(benchmark_dir).with_suffix("")),
                     "seconds": float(frame["s"][0]), "peak RSS (MB)": float(frame["max_rss"][0])})
    return pl.DataFrame(rows, schema={"step": pl.String, "seconds": pl.Float64, "peak RSS (MB)": pl.Float64})


# the study's phases, by the rules that make them (a rule's benchmark records are under its name)
PHASE_OF_RULE_PREFIX = {"fetch_": "models and tasks", "prepare_model": "models and tasks", "kv_task": "models and tasks",
                        "mmlu_task": "models and tasks", "lmeval_crosscheck_task": "models and tasks",
                        "baseline": "baseline", "collect_baseline": "baseline", "lm_eval": "baseline",
                        "prune_": "pruning", "minimal_model": "pruning", "heads_": "heads",
                        "gna_": "gather & aggregate", "distill_": "students", "hybrid_": "students"}


def phase_of(step: str) -> str:
    """The study phase of a benchmark record's step name '<rule>/<wildcards>' ('other' if none)."""
    rule = step.split("/", 1)[0]
    return next((phase for prefix, phase in PHASE_OF_RULE_PREFIX.items() if rule.startswith(prefix)), "other")


def phase_timings(steps: pl.DataFrame) -> pl.DataFrame:
    """Per phase (phase_of): steps, summed wall time and the largest peak RSS, plus a total row."""
    by_phase = (steps.with_columns(pl.col("step").map_elements(phase_of, return_dtype=pl.String).alias("phase"))
                .group_by("phase", maintain_order=True)
                .agg(pl.len().alias("steps"), pl.col("seconds").sum(), pl.col("peak RSS (MB)").max()))
    total = steps.select(pl.lit("all").alias("phase"), pl.len().alias("steps"), pl.col("seconds").sum(),
                         pl.col("peak RSS (MB)").max())
    return pl.concat([by_phase, total])


def provenance_table(config: dict, workflow_dir: str | Path) -> str:
    """When, from which commit and config, on which machine this report was made."""
    mach = machine()
    prov = {
        "generated": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "git commit": git_commit(workflow_dir),
        "config hash": config_hash(config),
        "python / torch": f"{mach['python']} / {mach['torch']}",
        "machine": f"{mach['platform']}, {mach['cpu_count']} CPUs, CUDA {'yes' if mach['cuda'] else 'no'}",
    }
    return table(pl.DataFrame({"item": list(prov), "value": list(prov.values())}), left=("item", "value"))


def closing_sections(config: dict, benchmark_dir: str | Path) -> str:
    """Timings of every step and the validated config."""
    steps = timings(benchmark_dir)
    parts = []
    if not steps.is_empty():
        fmt = {"seconds": lambda v: f"{v:.1f}", "peak RSS (MB)": lambda v: f"{v:.0f}"}
        parts.append("<h2>Timings</h2><p>Wall time and peak memory per phase and of each step (Snakemake "
                     "benchmark records; the sum of wall times is the run's length on one job at a time).</p>")
        parts.append(table(phase_timings(steps), left=("phase",), fmt=fmt))
        parts.append(table(steps, left=("step",), fmt=fmt))
    parts.append("<h2>Config</h2><details><summary>the validated config of this run</summary><pre>"
                 + html.escape(yaml.safe_dump(config, sort_keys=False)) + "</pre></details>")
    return "".join(parts)


def build_report(inputs: dict, html_path, figures: dict, options: dict, config: dict, benchmark_dir,
                 workflow_dir) -> None:
    """Render every registry section into one HTML file and write each section's figures.

    inputs: {input key: path or paths} as gna.report.registry.report_inputs gives them (a key
    without paths leaves its part out); figures: {figure name: PNG path}; options: the config's
    `report` section; config: the whole validated config (shown, hashed, read by sections)."""
    ctx = SectionContext(inputs=inputs, figures=figures, captions=captions(workflow_dir), options=options,
                         config=config)
    title = html.escape(options["title"])
    body = [f"<h1>{title}</h1>",
            "<p>Regenerated from the pipeline's Parquet results; every number below was computed by this run "
            "unless it sits in a table labelled <i>reference</i>.</p>",
            provenance_table(config, workflow_dir)]
    body += [render_function(section)(ctx) for section in SECTIONS]
    body.append(closing_sections(config, benchmark_dir))
    page = (f"<!doctype html><html><head><meta charset='utf-8'><title>{title}</title>"
            f"<style>{CSS}</style></head><body>{''.join(body)}</body></html>")
    write_text(page, html_path)
