"""docs/findings.md and its figures, written from docs/headline.json: one row per claim of the study,
the study's number beside it as a labelled reference (gna.report.study), then each model's result
with its n, interval and p, where the report and the Parquet files hold it. No sentence of the
page is typed by hand: `make findings` (called by `make headline`) writes it, and a test writes it
again from the committed headline and compares the bytes.

    python -m gna.report.findings docs/headline.json docs/findings.md
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from gna.report.study import CITATION, CONTRAST, DICT_SIZE, GNA_ROLES, HYBRID_HEADS, KEPT_HEADS, STATE_SIZE, VERBS, cell

FIGURES = "figures"  # beside findings.md: each figure's PNG and the CSV it is drawn from
TASK_NAMES = {
    "kv_retrieval": "KV",
    "mmlu_letter": "MMLU letter",
    "mmlu_cloze": "MMLU cloze",
    "facts_cloze": "facts cloze",
    "facts_choice": "facts choice",
}


@dataclass(frozen=True)
class Claim:
    """One claim of the study: what it says, what the study reports (a reference), and how to read
    each model's result from its headline entries (`cell`); `where`: the report section and the
    Parquet file, {model} standing for the model's name."""

    claim: str
    study: str
    cell: object  # (entries by name, model) -> text, or None where the headline has nothing for it
    where: str


def models_of(entries: list[dict]) -> list[str]:
    """The models the headline covers, in its order (each has a baseline)."""
    names = [e["name"].split(" baseline ")[0] for e in entries if " baseline " in e["name"]]
    return list(dict.fromkeys(names))


def _p(value: float) -> str:
    return f"{value:.2g}" if value >= 1e-3 else f"{value:.1e}"


def accuracy(entry: dict) -> str:
    """'43.5% [36.8–50.4] (n = 200)': an accuracy with its 95% interval and n."""
    low, high = entry["ci"]
    return f"{100 * entry['value']:.1f}% [{100 * low:.1f}–{100 * high:.1f}] (n = {entry['n']})"


def verdict_text(entry: dict) -> str:
    """'falls: 44 lost / 1 gained of 60, Holm p = 4.7e-11': a paired verdict with its counts and p."""
    counts = f"{entry['lost']} lost / {entry['gained']} gained of {entry['n']}"
    p = f", Holm p = {_p(entry['p_holm'])}" if "p_holm" in entry else ""
    return f"{entry['value']}: {counts}{p}"


def _find(entries: dict, pattern: str) -> tuple[dict | None, re.Match | None]:
    """The first entry whose name matches `pattern` whole, and its match."""
    for name, entry in entries.items():
        match = re.fullmatch(pattern, name)
        if match:
            return entry, match
    return None, None


def _removal(entries: dict, model: str, task: str) -> str | None:
    """A top-k removal on one task: the accuracy before and after, and the paired verdict."""
    m = re.escape(model)
    paired, match = _find(entries, rf"{m}: top (\d+) vs unmodified, {task}")
    if paired is None:
        return None
    k = match.group(1)
    before, after = entries.get(f"{model} baseline {task}"), entries.get(f"{model} top {k} removed {task}")
    change = f"{accuracy(before)} → {accuracy(after)}" if before and after else ""
    return f"{TASK_NAMES[task]} {change}, top {k} removed: {verdict_text(paired)}".replace("  ", " ")


def _join(parts: list[str | None]) -> str | None:
    kept = [p for p in parts if p]
    return "; ".join(kept) if kept else None


def few_heads(entries: dict, model: str) -> str | None:
    top = entries.get(f"{model} top-ranked head")
    m = re.escape(model)
    control, match = _find(entries, rf"{m}: top (\d+) vs random \d+ #0, kv_retrieval")
    return _join(
        [
            f"top-ranked unit {top['value']}" if top else None,
            _removal(entries, model, "kv_retrieval"),
            f"against {match.group(1)} random units: {verdict_text(control)}" if control else None,
        ]
    )


def letter_not_knowledge(entries: dict, model: str) -> str | None:
    """The contrast, never stronger than its premise: the headline's verdict on it (gna.report.contrast_verdict)
    with its reason, then the letter format's and the facts' removal. A headline recorded before that
    entry existed: not tested where the letter format is not answered or the units removed are not shown
    to carry retrieval (their KV removal does not fall), else only whether a fall to chance is excluded."""
    m = re.escape(model)
    state, match = _find(entries, rf"{m}: the study's contrast \((top \d+ removed|case study)\)")
    if state is not None and match.group(1) == "case study":  # the case study's removal, not the top-k table's
        removal = [
            f"{task.replace('_', ' ')}: {verdict_text(row)}"
            for task in ("mmlu_letter", "facts_cloze")
            for row in [_find(entries, rf"{m} case study heads kept: kept − L\d+H\d+ vs kept, {task}")[0]]
            if row is not None
        ]
        heads = entries.get(f"{model} case study: heads found")
        found = f"head found {heads['value']}, removed from the kept configuration" if heads else None
        return _join([f"**{state['value']}: {state['reason']}**", found, *removal])
    answered = entries.get(f"{model} a letter form answered")
    kv, _ = _find(entries, rf"{m}: top \d+ vs unmodified, kv_retrieval")
    letter, knowledge = _removal(entries, model, "mmlu_letter"), _removal(entries, model, "facts_cloze")
    if state is not None:
        reason = f"{state['value']}: {state['reason']}"
    elif answered is None and kv is None:
        return None
    elif answered is not None and answered["value"] != "yes":
        reason = "not tested: the model answers no letter form above chance"
    elif kv is None or kv["value"] != "falls":
        reason = "not tested: the units removed are not shown to carry retrieval" + (
            f" (KV {verdict_text(kv)})" if kv else ""
        )
    else:
        fall, _ = _find(entries, rf"{m}: top \d+ vs unmodified, mmlu_letter: a fall to chance")
        reason = f"a fall to chance {fall['value']}" if fall else None
    return _join([f"**{reason}**" if reason else None, letter, knowledge])


def _students(entries: dict, model: str, pattern: str) -> str | None:
    m = re.escape(model)
    rows = [
        f"{match.group(1)}: {verdict_text(entry)}"
        for name, entry in entries.items()
        if (match := re.fullmatch(rf"{m} students: ({pattern}), kv_retrieval", name))
    ]
    return "; ".join(rows) or None


def ssm_heads(entries: dict, model: str) -> str | None:
    return _students(entries, model, r"k0-n\d+ vs teacher")


def hybrids(entries: dict, model: str) -> str | None:
    return _students(entries, model, r"k(?:[1-9]\d*)-n\d+ vs k0-n\d+")


def state_size(entries: dict, model: str) -> str | None:
    return _students(entries, model, r"k0-n\d+ vs k0-n16")


def layer_swap(entries: dict, model: str) -> str | None:
    return _students(entries, model, r"k0-n\d+ \+ attention layer \d+ vs k0-n\d+")


def masking(entries: dict, model: str) -> str | None:
    rows = [
        f"{name.split('G&A masking: ')[1].split(' vs ')[0]}, {TASK_NAMES['kv_retrieval']}: {verdict_text(entry)}"
        for name, entry in entries.items()
        if name.startswith(f"{model} G&A masking: ") and name.endswith(", kv_retrieval")
    ]
    return "; ".join(rows) or None


def heads_kept(entries: dict, model: str) -> str | None:
    minimal = entries.get(f"{model} minimal model layers")
    rows = [
        f"{name.split('heads kept: ')[1].split(' vs ')[0]}: {verdict_text(entry)}"
        for name, entry in entries.items()
        if name.startswith(f"{model} heads kept: ") and name.endswith(", kv_retrieval")
    ]
    if not rows:
        return None
    depth = f"minimal model: {minimal['value']} layers" if minimal else None
    return _join([depth, "KV vs all heads kept, " + "; ".join(rows)])


def _kept_text() -> str:
    """The study's heads-kept table in one line, from its rows: both heads kept, each removed, knowledge."""
    (h16, h17, both, _), (_, _, no16, _), (_, _, no17, _), *_ = KEPT_HEADS["rows"]
    knowledge = sorted(row[3] for row in KEPT_HEADS["rows"])
    return (
        f"{KEPT_HEADS['what']}: L16H{h16} and L17H{h17} kept, MMLU letter {both}; L16H{h16} removed {no16}, "
        f"L17H{h17} removed {no17} (chance); knowledge tasks {knowledge[0]}–{knowledge[-1]}"
    )


def _table_text(table: dict, pick: tuple[int, ...]) -> str:
    cols = table["columns"]
    return "; ".join(", ".join(f"{cols[i]} {cell(row[i])}" for i in pick) for row in table["rows"])


CLAIMS = (
    Claim(
        "Retrieval lives in a few heads: removing the top-ranked ones makes KV retrieval fall, "
        "as many random ones do not",
        f"{CONTRAST['kv_retrieval'][1]} (Llama-3.1-8B, G&A heads disabled)",
        few_heads,
        "report: remove-top-k · `data/results/heads/{model}/topk.comparisons.parquet`",
    ),
    Claim(
        "Removing them costs the letter format, not knowledge",
        f"MMLU letter {CONTRAST['mmlu_letter'][1]}; cloze knowledge {CONTRAST['facts_cloze'][0]}",
        letter_not_knowledge,
        "report: the contrast · `data/results/heads/{model}/topk.comparisons.parquet`",
    ),
    Claim(
        "In the pruned model, one head per critical layer carries the letter format",
        _kept_text(),
        heads_kept,
        "report: heads kept · `data/results/heads/{model}/kept.comparisons.parquet`",
    ),
    Claim(
        "Retrieval heads split into Gather and Aggregate roles",
        GNA_ROLES,
        lambda entries, model: None,  # the roles table is not in the headline yet
        "report: G&A roles · `data/results/gna/{model}/roles.parquet`",
    ),
    Claim(
        "The dictionary-size curve: removing one of the two heads costs a constant share, the other more with size",
        DICT_SIZE,
        lambda entries, model: None,  # the curves are not in the headline yet
        "report: dictionary size · `data/results/heads/{model}/dictsize.parquet`",
    ),
    Claim(
        "Masking: the G&A heads' pattern alone keeps retrieval; ablating them removes it",
        "G&A heads ablated: retrieval falls; their pattern alone: retrieval holds",
        masking,
        "report: G&A masking · `data/results/gna/{model}/masking.comparisons.parquet`",
    ),
    Claim(
        "SSM heads lose retrieval and keep knowledge",
        f"pure SSM (0 heads kept): KV {VERBS['ssm']['kv']}, cloze {VERBS['ssm']['cloze']}; "
        + _table_text({**HYBRID_HEADS, "rows": HYBRID_HEADS["rows"][:1]}, (0, 3, 4)),
        ssm_heads,
        "report: students · `data/results/hybrid/{model}/comparisons.parquet`",
    ),
    Claim(
        "Hybrids keeping a few attention heads retrieve",
        f"KV {VERBS['hybrid']['kv']} with heads kept: " + _table_text(HYBRID_HEADS, (0, 3)),
        hybrids,
        "report: students against budget · `data/results/hybrid/{model}/comparisons.parquet`",
    ),
    Claim(
        "A larger SSM state helps retrieval",
        _table_text(STATE_SIZE, (0, 2)),
        state_size,
        "report: state size · `data/results/hybrid/{model}/comparisons.parquet`",
    ),
    Claim(
        "The critical layer's attention brings retrieval back to a pure SSM",
        f"KV {VERBS['swap']['kv']}, cloze {VERBS['swap']['cloze']}",
        layer_swap,
        "report: layer swap · `data/results/hybrid/{model}/comparisons.parquet`",
    ),
)
NOT_IN_HEADLINE = "not in the headline"


def provenance(entries: list[dict]) -> str:
    """Where the headline comes from (its provenance entry, written by `make headline`)."""
    found = next((e for e in entries if e["kind"] == "provenance"), None)
    if found is None:
        return "The headline names no run it was recorded from."
    return (
        f"Recorded from `make reproduce` of commit {found['commit']} on {found['cpu']} "
        f"({found['cores']} cores), {found['date']}."
    )


def findings_markdown(entries: list[dict]) -> str:
    """The page: provenance, the figures, then one row per claim with each model's cell."""
    by_name = {e["name"]: e for e in entries}
    models = models_of(entries)
    lines = [
        "# Findings",
        "",
        "<!-- written by `make findings` from docs/headline.json (gna.report.findings): do not edit -->",
        "",
        f"What the default study finds, claim by claim, beside what the study ({CITATION}) reports. "
        + provenance(entries)
        + " Each result is the paired comparison of two conditions on the same items: the verdict "
        "(`falls`, `rises`, `holds` within ±5 points, `undecided`), the items lost and gained, and the "
        "Holm-corrected exact McNemar p; an accuracy carries its 95% interval and n. `make check` compares "
        "your run with these numbers.",
        "",
        f"![Accuracy before and after the top units' removal, per model and task]({FIGURES}/removal.png)",
        "",
        "*Each model's accuracy per task, unmodified (grey) and with its top-ranked units removed (red: the units "
        "its ranking names, heads or key/value groups), with 95% intervals. A removal scored on items of its own "
        "(a KV setting of the model's overrides) shows another set than the baseline beside it; the table's paired "
        f"verdicts decide. Data: [{FIGURES}/removal.csv]({FIGURES}/removal.csv).*",
        "",
        f"![Students' KV accuracy against attention heads kept]({FIGURES}/students.png)",
        "",
        "*Each distilled student's KV accuracy (state size 16) against the attention heads it keeps, with 95% "
        f"intervals, and its teacher's (dashed). Data: [{FIGURES}/students.csv]({FIGURES}/students.csv).*",
        "",
        "| the study's claim | the study reports (reference) | " + " | ".join(models) + " | where |",
        "|---" * (len(models) + 3) + "|",
    ]
    for claim in CLAIMS:
        cells = [claim.cell(by_name, model) or NOT_IN_HEADLINE for model in models]
        where = claim.where.format(model="<model>")
        lines.append(f"| {claim.claim} | {claim.study} | " + " | ".join(cells) + f" | {where} |")
    lines += [
        "",
        f"Cells reading “{NOT_IN_HEADLINE}”: the run the headline comes from did not run that part for "
        "the model (its config leaves it out), or the headline does not record it yet.",
        "",
    ]
    return "\n".join(lines)


def figure_data(entries: list[dict]) -> dict[str, list[dict]]:
    """The rows each figure is drawn from: accuracy before and after the top-k removal per model and
    task (removal), and each student's KV accuracy by heads kept (students)."""
    by_name = {e["name"]: e for e in entries}
    removal, students = [], []
    for model in models_of(entries):
        for name, entry in by_name.items():
            match = re.fullmatch(rf"{re.escape(model)} top (\d+) removed (\w+)", name)
            base = match and by_name.get(f"{model} baseline {match.group(2)}")
            if base:
                for condition, e in (("unmodified", base), (f"top {match.group(1)} removed", entry)):
                    removal.append(
                        {"model": model, "task": match.group(2), "condition": condition, "acc": e["value"],
                         "low": e.get("ci", [None, None])[0], "high": e.get("ci", [None, None])[1], "n": e["n"]}
                    )  # fmt: skip
            match = re.fullmatch(rf"{re.escape(model)} student (k(\d+)-n(\d+)|teacher) kv_retrieval", name)
            if match:
                students.append(
                    {"model": model, "variant": match.group(1), "heads_kept": int(match.group(2) or -1),
                     "state_size": int(match.group(3) or -1), "acc": entry["value"], "low": entry["ci"][0],
                     "high": entry["ci"][1], "n": entry["n"]}
                )  # fmt: skip
    return {"removal": removal, "students": students}


def write_figures(data: dict[str, list[dict]], folder: Path) -> None:
    """Each figure as a small PNG beside the CSV of the rows it is drawn from."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import polars as pl

    folder.mkdir(parents=True, exist_ok=True)
    for name, rows in data.items():
        pl.DataFrame(rows).write_csv(folder / f"{name}.csv")
    removal = pl.DataFrame(data["removal"]) if data["removal"] else None
    models = removal["model"].unique(maintain_order=True).to_list() if removal is not None else []
    fig, axes = plt.subplots(1, max(1, len(models)), figsize=(4.2 * max(1, len(models)), 3.2), squeeze=False)
    if not models:
        axes[0][0].text(0.5, 0.5, "no removal in the headline", ha="center", va="center")
    for ax, model in zip(axes[0], models):
        sub = removal.filter(pl.col("model") == model)
        tasks = sub["task"].unique(maintain_order=True).to_list()
        for offset, (condition, color) in enumerate(zip(sub["condition"].unique(maintain_order=True), ("0.6", "C3"))):
            part = sub.filter(pl.col("condition") == condition)
            xs = [tasks.index(t) + 0.4 * (offset - 0.5) for t in part["task"]]
            ax.bar(xs, part["acc"] * 100, width=0.4, color=color, label=condition)
            low, high = part["low"].fill_null(part["acc"]), part["high"].fill_null(part["acc"])
            errors = [(part["acc"] - low) * 100, (high - part["acc"]) * 100]
            ax.errorbar(xs, part["acc"] * 100, yerr=errors, fmt="none", color="k", lw=0.8)
        ax.set_xticks(range(len(tasks)), [TASK_NAMES.get(t, t) for t in tasks], rotation=30, ha="right", fontsize=8)
        ax.set_ylim(0, 105)
        ax.set_title(model, fontsize=9)
        ax.set_ylabel("accuracy (%), 95% interval")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(folder / "removal.png", dpi=80)
    plt.close(fig)
    students = pl.DataFrame(data["students"]) if data["students"] else None
    fig, ax = plt.subplots(figsize=(4.5, 3.2))
    if students is not None:
        for model in students["model"].unique(maintain_order=True):
            sub = students.filter((pl.col("model") == model) & (pl.col("state_size") == 16)).sort("heads_kept")
            errors = [(sub["acc"] - sub["low"]) * 100, (sub["high"] - sub["acc"]) * 100]
            ax.errorbar(
                sub["heads_kept"], sub["acc"] * 100, yerr=errors, fmt="o-", label=f"{model} students (state 16)"
            )
            teacher = students.filter((pl.col("model") == model) & (pl.col("variant") == "teacher"))
            if len(teacher):
                ax.axhline(teacher["acc"][0] * 100, ls="--", color="gray", label=f"{model} teacher")
    ax.set_xlabel("attention heads kept")
    ax.set_ylabel("KV accuracy (%), 95% interval")
    ax.set_ylim(0, 105)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(folder / "students.png", dpi=80)
    plt.close(fig)


def write_findings(headline_path: str | Path, out: str | Path) -> None:
    """docs/findings.md (`out`) and its figures (figures/ beside it) from the headline at `headline_path`."""
    entries = json.loads(Path(headline_path).read_text())
    out = Path(out)
    out.write_text(findings_markdown(entries))
    write_figures(figure_data(entries), out.parent / FIGURES)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    write_findings(sys.argv[1], sys.argv[2])
    print(f"wrote {sys.argv[2]} and its figures from {sys.argv[1]}")
