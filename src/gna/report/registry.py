"""The report's sections: what each reads, which figures it draws, which caption each figure has.

One registry for both sides: rules/report.smk builds the report rule's input and output from it,
and gna.report.page renders the sections in this order, each figure captioned from the same
rules/captions/<figure>.rst that Snakemake's own report shows.

Standard library only: the workflow imports this module when it parses, and the plotting
libraries the sections use take seconds to import. So a section names its render function
('module:function') instead of importing it; gna.report.page imports every render module.
"""

from __future__ import annotations

import itertools
import string
from dataclasses import dataclass

FIGURE_DIR = "data/report/figures"
CAPTION_DIR = "rules/captions"  # relative to the workflow folder
HTML = "data/report/index.html"


@dataclass(frozen=True)
class Input:
    """A result the report reads: `pattern` is expanded over the wildcard lists it names
    ({model}, {case_model}, {pruned_model}, {attribution_model}, {hybrid_model}, {gna_model}, {scored_variant},
    {student_variant}, {answer_row_variant}, {state_size}, {paired_mmlu_format}: letter and cloze where
    the config scores both, else none; {facts_format}: tasks.facts.formats); `switch`, when set, names the config switch
    without which it is not made."""

    key: str
    pattern: str
    switch: str | None = None

    def wildcards(self) -> list[str]:
        """The wildcard names of the pattern, in order of appearance."""
        return list(dict.fromkeys(name for _, name, _, _ in string.Formatter().parse(self.pattern) if name))

    def paths(self, values: dict[str, list], switches: dict[str, bool]) -> str | list[str]:
        """The path (no wildcards) or the list of paths (first wildcard outermost, like expand)."""
        names = self.wildcards()
        if not names:
            return self.pattern
        if self.switch and not switches[self.switch]:
            return []
        return [
            self.pattern.format(**dict(zip(names, combo)))
            for combo in itertools.product(*(values[name] for name in names))
        ]


@dataclass(frozen=True)
class Figure:
    """A figure of the report: data/report/figures/<name>.png, captioned by <name>.rst."""

    name: str
    category: str

    @property
    def path(self) -> str:
        return f"{FIGURE_DIR}/{self.name}.png"

    @property
    def caption_file(self) -> str:
        """The caption, relative to the workflow folder."""
        return f"{CAPTION_DIR}/{self.name}.rst"


@dataclass(frozen=True)
class Section:
    """A part of the report: its inputs, its figures, and its render function ('module:function',
    called with a gna.report.htmlkit.SectionContext and returning the section's HTML)."""

    name: str
    inputs: tuple[Input, ...]
    figures: tuple[Figure, ...]
    render: str


def _figures(category: str, *names: str) -> tuple[Figure, ...]:
    return tuple(Figure(name, category) for name in names)


def _results(phase: str, names: tuple[str, ...], model: str = "model") -> tuple[Input, ...]:
    """Inputs <phase>_<name>: data/results/<phase>/{<model>}/<name>.parquet."""
    return tuple(Input(f"{phase}_{name}", f"data/results/{phase}/{{{model}}}/{name}.parquet") for name in names)


SECTIONS: tuple[Section, ...] = (
    Section("models", (Input("models", "data/models/{model}"),), (), "gna.report.baseline_section:render_models"),
    # the study's MMLU case study leads (gna.phases.case_study), on the models of case_study.models
    Section(
        "case",
        (
            Input("case_gradual", "data/results/case/{case_model}/gradual.parquet"),
            Input("case_minimal", "data/results/case/{case_model}/minimal.json"),
            Input("case_layers_comparisons", "data/results/case/{case_model}/layers.comparisons.parquet"),
            Input("case_critical", "data/results/case/{case_model}/critical.json"),
            Input("case_sweep", "data/results/case/{case_model}/sweep.parquet"),
            Input("case_found", "data/results/case/{case_model}/found.json"),
            Input("case_kept", "data/results/case/{case_model}/kept.parquet"),
            Input("case_kept_comparisons", "data/results/case/{case_model}/kept.comparisons.parquet"),
            Input("case_roles", "data/results/case/{case_model}/roles.parquet"),
            Input("case_maps", "data/results/case/{case_model}/maps.parquet"),
            Input("case_masking", "data/results/case/{case_model}/masking.parquet"),
            Input("case_masking_comparisons", "data/results/case/{case_model}/masking.comparisons.parquet"),
        ),
        _figures("The study's MMLU case study", "case_gradual", "case_layers", "case_sweep", "case_maps"),
        "gna.report.case_section:render_case",
    ),
    # the study's central contrast leads; it reads the baseline's and the heads section's inputs
    Section(
        "contrast", (), _figures("The study's contrast", "contrast_topk"), "gna.report.contrast_section:render_contrast"
    ),
    Section(
        "baseline",
        (
            Input("baseline", "data/results/baseline.parquet"),
            Input("kv_task", "data/tasks/kv_retrieval.parquet"),
            # the same MMLU questions in both formats, per item: letter and cloze compared as a pair
            Input("baseline_mmlu_items", "data/results/baseline/{model}/mmlu_{paired_mmlu_format}.items.parquet"),
        ),
        _figures("Baseline", "baseline_kv", "baseline_mmlu"),
        "gna.report.baseline_section:render_baseline",
    ),
    Section(
        "prune",
        (
            *_results("prune", ("gradual", "individual"), model="pruned_model"),
            Input("prune_gradual_comparisons", "data/results/prune/{pruned_model}/gradual.comparisons.parquet"),
            Input("prune_minimal", "data/results/prune/{pruned_model}/minimal_model.json"),
        ),
        _figures("Layer pruning", "prune_gradual", "prune_individual"),
        "gna.report.prune_section:render_prune",
    ),
    Section(
        "heads",
        (
            *_results("heads", ("sweep", "ranking", "topk", "dictsize")),
            *_results("heads", ("kept",), model="pruned_model"),
            Input("heads_topk_comparisons", "data/results/heads/{model}/topk.comparisons.parquet"),
            Input("heads_kept_comparisons", "data/results/heads/{pruned_model}/kept.comparisons.parquet"),
            Input("heads_attribution", "data/results/heads/{attribution_model}/attribution.parquet"),
        ),
        _figures("Heads", "heads_heatmap", "heads_topk", "heads_dictsize", "heads_attribution"),
        "gna.report.heads_section:render_heads",
    ),
    Section(
        "gna",
        (
            *_results("gna", ("roles", "maps", "masking"), model="gna_model"),
            Input("gna_masking_comparisons", "data/results/gna/{gna_model}/masking.comparisons.parquet"),
        ),
        _figures("Gather-and-Aggregate", "gna_maps", "gna_maps_mmlu"),
        "gna.report.gna_section:render_gna",
    ),
    Section(
        "hybrid",
        (
            Input("hybrid_scores", "data/results/hybrid/{hybrid_model}/{scored_variant}.parquet", "hybrid"),
            Input("hybrid_swap", "data/results/hybrid/{hybrid_model}/swap.parquet", "hybrid_swap"),
            Input(
                "hybrid_answer_rows",
                "data/results/hybrid/{hybrid_model}/answer-rows-{answer_row_variant}.parquet",
                "hybrid",
            ),
            Input("hybrid_memory", "data/results/hybrid/{hybrid_model}/memory.parquet", "hybrid"),
            Input("hybrid_comparisons", "data/results/hybrid/{hybrid_model}/comparisons.parquet", "hybrid"),
            Input("hybrid_align", "data/distill/{hybrid_model}/align-n{state_size}.parquet", "hybrid"),
            Input("hybrid_align_heads", "data/distill/{hybrid_model}/align-n{state_size}-heads.parquet", "hybrid"),
            Input("hybrid_kd", "data/distill/{hybrid_model}/kd-{student_variant}.parquet", "hybrid"),
            Input("hybrid_validation", "data/distill/{hybrid_model}/kd-{student_variant}-validation.parquet", "hybrid"),
            Input("hybrid_changes", "data/distill/{hybrid_model}/kd-{student_variant}-changes.parquet", "hybrid"),
            Input("hybrid_budget", "data/results/hybrid/{hybrid_model}/budget-{budget_variant}.parquet", "hybrid"),
            Input(
                "hybrid_budget_steps",
                "data/results/hybrid/{hybrid_model}/budget-{budget_variant}.comparisons.parquet",
                "hybrid",
            ),
            Input(
                "hybrid_knowledge",
                "data/results/hybrid/{hybrid_model}/training-facts-{budget_variant}.comparisons.parquet",
                "hybrid",
            ),
            Input("hybrid_ablation", "data/results/hybrid/{hybrid_model}/ablation-{ablation}.parquet", "hybrid"),
        ),
        _figures("SSM and hybrid students", "hybrid_heads", "hybrid_budget", "hybrid_training", "hybrid_align_heads"),
        "gna.report.hybrid_section:render_hybrid",
    ),
    Section(
        "knowledge",
        (
            Input("facts_formats", "data/results/facts/{model}/formats.parquet", "facts_choice"),
            # per item and relation: where the answers go (the task tables carry the relation)
            Input("facts_tasks", "data/tasks/facts_{facts_format}.parquet"),
            Input("facts_items", "data/results/baseline/{model}/facts_{facts_format}.items.parquet"),
        ),
        _figures("Knowledge vs retrieval", "knowledge_view"),
        "gna.report.knowledge_section:render_knowledge",
    ),
)

FIGURES: tuple[Figure, ...] = tuple(figure for section in SECTIONS for figure in section.figures)


def report_inputs(values: dict[str, list], switches: dict[str, bool]) -> dict[str, str | list[str]]:
    """Every section's inputs, {key: path or paths}: `values` gives each wildcard's list (model,
    case_model, pruned_model, attribution_model, hybrid_model, gna_model, scored_variant, student_variant,
    answer_row_variant, budget_variant, ablation, state_size, paired_mmlu_format, facts_format),
    `switches` the config switches (hybrid, hybrid_swap, facts_choice)."""
    return {put.key: put.paths(values, switches) for section in SECTIONS for put in section.inputs}


def report_figures() -> dict[str, str]:
    """{figure name: PNG path} of every section's figures."""
    return {figure.name: figure.path for figure in FIGURES}
