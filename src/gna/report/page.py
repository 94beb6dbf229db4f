"""The HTML report: tables and figures regenerated from Parquet results, with provenance.

Self-contained (figures embedded as base64 PNG) so the single file can be mailed or archived.
The sections, their inputs, figures and captions come from gna.report.registry, which the
report rule reads too.
"""

from __future__ import annotations

import html
import json
from dataclasses import dataclass
from pathlib import Path

import polars as pl
import yaml

from gna.core.io import write_text
from gna.core.provenance import config_hash, workflow_code_hash
from gna.core.settings import Files, RuleSettings
from gna.report import (
    baseline_section,
    case_section,
    contrast_section,
    gna_section,
    heads_section,
    hybrid_section,
    knowledge_section,
    prune_section,
)
from gna.report.htmlkit import CSS, ReportOptions, SectionContext, read_caption, table
from gna.report.registry import FIGURES, SECTIONS, Section
from gna.report.run_record import RUN_RECORD

# the run record, relative to the report's folder (both under data/)
RUN_RECORD_LINK = "../" + Path(RUN_RECORD).relative_to("data").as_posix()
# the sections' render modules, imported (not looked up by name) so that the report rule's code
# fingerprint covers them: a section whose module is missing here fails instead of going unhashed
RENDER_MODULES = {
    module.__name__: module
    for module in (
        baseline_section,
        case_section,
        contrast_section,
        gna_section,
        heads_section,
        hybrid_section,
        knowledge_section,
        prune_section,
    )
}


def render_function(section: Section):
    """The section's render function, from its 'module:function' name."""
    module, name = section.render.split(":")
    return getattr(RENDER_MODULES[module], name)


def captions(workflow_dir: str | Path) -> dict[str, str]:
    """{figure name: caption HTML}, read from the workflow's rules/captions/<figure>.rst."""
    return {figure.name: read_caption(Path(workflow_dir) / figure.caption_file) for figure in FIGURES}


def provenance_table(config: dict, workflow_dir: str | Path) -> str:
    """From which code and config this report was made, in which precision. Nothing that changes
    between two runs of the same code and config (time, machine, Python and torch builds, git
    commit): those are in the run record, so the report hashes the same wherever its results do."""
    prov = {
        "code hash": workflow_code_hash(workflow_dir),
        "config hash": config_hash(config),
        "precision": precision_text(config),
    }
    return (
        table(pl.DataFrame({"item": list(prov), "value": list(prov.values())}), left=("item", "value"))
        + f"<p>When and where the run ran (machine, Python and torch builds), its git commit and the wall "
        f"time and memory of every step: <a href='{RUN_RECORD_LINK}'>the run record</a> "
        f"(<code>{RUN_RECORD}</code>).</p>"
    )


def precision_text(config: dict) -> str:
    """The dtypes the numbers were computed in, in words (keys dtype and eval.compute_dtype)."""
    weights, matmuls = config["dtype"], config["eval"]["compute_dtype"]
    if matmuls == "float32" or matmuls == weights:
        return f"weights and evaluation in {weights}"
    return (
        f"weights, residual stream, norms, attention, SSM scans and log-softmax in {weights}; the linear layers' "
        f"matmuls, the output head's included, in {matmuls} when models are evaluated (eval.compute_dtype; "
        "float32 is the reference)"
    )


def closing_sections(config: dict) -> str:
    """The validated config, keys sorted: the same config gives the same report whatever order
    its file lists the keys in."""
    return (
        "<h2>Config</h2><details><summary>the validated config of this run</summary><pre>"
        + html.escape(yaml.safe_dump(config, sort_keys=True))
        + "</pre></details>"
    )


def build_report(
    inputs: dict | Files, html_path, figures: dict, options: ReportOptions, config: dict, workflow_dir
) -> None:
    """Render every registry section into one HTML file and write each section's figures.

    inputs: {input key: path or paths} as gna.report.registry.report_inputs gives them (or the
    rule's Files of them; a key without paths leaves its part out); figures: {figure name: PNG
    path}; options: the config's `report` section; config: the whole validated config (shown,
    hashed, read by sections)."""
    ctx = SectionContext(
        inputs=inputs, figures=figures, captions=captions(workflow_dir), options=options, config=config
    )
    title = html.escape(options.title)
    body = [
        f"<h1>{title}</h1>",
        "<p>Regenerated from the pipeline's Parquet results; every number below was computed by this run "
        "unless it sits in a table labelled <i>reference</i>.</p>",
        provenance_table(config, workflow_dir),
    ]
    body += [render_function(section)(ctx) for section in SECTIONS]
    body.append(closing_sections(config))
    page = (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{title}</title>"
        f"<style>{CSS}</style></head><body>{''.join(body)}</body></html>"
    )
    write_text(page, html_path)


@dataclass(frozen=True)
class Report(RuleSettings):
    """Rule report: the report's options (config section report); `config_json`, the whole
    validated config as JSON (json.dumps of the dict the workflow validated): the report shows it,
    hashes it and its sections read parts of it (models' skip, hybrid, tasks.facts), so every
    key of it is what the report reads; and `workflow_dir`, the workflow folder (its code is
    hashed, its captions read)."""

    options: ReportOptions = ReportOptions()
    config_json: str = "{}"
    workflow_dir: str = "."


def run_report(inputs: Files, outputs: Files, settings: Report) -> None:
    """Rule report: every registry section rendered from the inputs (by the keys of
    gna.report.registry.report_inputs) into the outputs' `html`, each figure written to the
    output named after it (gna.report.registry.FIGURES)."""
    figures = {figure.name: getattr(outputs, figure.name) for figure in FIGURES}
    config = json.loads(settings.config_json)
    build_report(inputs, outputs.html, figures, settings.options, config, settings.workflow_dir)
