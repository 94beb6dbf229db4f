"""Did this run reproduce the study as main records it? The headline numbers and verdicts of a
finished run, compared with a reviewed summary (docs/headline.json, written from a default run).

Results differ between CPU kinds in bf16 rounding (same conclusions, other bytes), so `git diff
dvc.lock` cannot tell a user whether their run reproduced main's. This compares what a reader
reads: each accuracy (equal, within the recorded 95% interval, within the CPU kinds' rounding, or
differs) and each verdict of the paired tests (the same verb, borderline, or changed), and ends
with one line.

What reproduction means across CPU kinds, by measurement: runs of the same code on AMD Zen 4 and
Intel AMX differed by up to 3 of 200 items on one accuracy (a student's KV, 97.5% → 99.0%) and
flipped 2 of 42 verdicts whose tests sat next to their thresholds. So an accuracy that moves by
at most ROUNDING_SHARE of its items is "within rounding", and a verdict that changes where either
run's table, with at most that many items moved, gives the other run's verdict is "borderline",
printed with both runs' counts and p-values; neither fails the check. A verdict further from its
threshold than that still reads "changed".

    python -m gna.report.headline write data docs/headline.json   # record a run's headline
    python -m gna.report.headline check docs/headline.json data   # compare a run with it
"""

from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path

import polars as pl

from gna.core.chance import above_chance, answered
from gna.core.paired import DEFAULT_MARGIN, NOT_COPYABLE, SUBSETS, decide, fall_excluded, mcnemar_p
from gna.core.stats import wilson_interval
from gna.report.contrast_verdict import CaseStudy, case_verdict, removal_verdict
from gna.students.spec import TEACHER_VARIANT, VARIANT_PATTERN

CASE_CHANCE = 0.25  # the case study's letter format: four options

ROUNDING_SHARE = 0.015  # 3 of 200 items: the largest move between Zen 4's and Intel AMX's runs of the same code
KNOWLEDGE_K = 5  # the top-k removal the knowledge view reads (the largest k of the table up to it)


def knowledge_k(conditions) -> int | None:
    """The k the knowledge view, the contrast and the headline read from a remove-top-k comparisons
    table's condition labels ('top 5', …): KNOWLEDGE_K, or the largest k below it; None without one."""
    ks = [int(c.split()[1]) for c in conditions if c.startswith("top ") and 0 < int(c.split()[1]) <= KNOWLEDGE_K]
    return max(ks, default=None)


# the study's contrast: MMLU letter against its cloze form and the facts, beside KV (a model at chance on
# a task has no comparisons row there, so no verdict)
VERDICT_TASKS = ("kv_retrieval", "mmlu_letter", "mmlu_cloze", "facts_cloze", "facts_choice")


def _read(path: Path) -> pl.DataFrame:
    return pl.read_parquet(path) if path.is_file() else pl.DataFrame()


def _accuracy(name: str, value: float, n: int) -> dict:
    low, high = wilson_interval(value * n, n)
    return {"name": name, "kind": "accuracy", "value": value, "n": n, "ci": [low, high]}


def _verdicts(frame: pl.DataFrame, prefix: str, margin: float, tasks=VERDICT_TASKS, group: str = "all") -> list[dict]:
    """A verdict entry per comparisons-table row on `group` of `tasks` (None: every task)."""
    out = []
    rows = frame.filter(pl.col("group") == group) if not frame.is_empty() else frame
    for row in rows.iter_rows(named=True):
        if tasks is not None and row["task"] not in tasks:
            continue
        where = "" if group == "all" else f" ({group})"
        out.append(
            {
                "name": f"{prefix}: {row['condition']} vs {row['reference']}, {row['task']}{where}",
                "kind": "verdict",
                "value": verdict(row, margin),
                "n": row["n"],
                # what the verdict was decided on: a check on another CPU kind tells a verdict next to
                # its threshold (borderline) from a change of the science
                "lost": row["reference_only"],
                "gained": row["condition_only"],
                "p_mcnemar": row["p_mcnemar"],
                "p_holm": row["p_holm"],
                "holm_multiplier": row["holm_multiplier"],
            }
        )
    return out


def _fall_to_chance(chosen: pl.DataFrame, accuracies: pl.DataFrame, model: str, k: int) -> list[dict]:
    """The contrast's claim on the letter form, as the report reads it: whether the top-k removal's
    items exclude a fall to chance (gna.core.paired.fall_excluded), chance from the model's baseline."""
    rows = chosen.filter((pl.col("task") == "mmlu_letter") & (pl.col("group") == "all"))
    base = accuracies.filter(pl.col("task") == "mmlu_letter")
    if rows.is_empty() or base.is_empty() or "chance" not in base.columns:
        return []
    row, chance = rows.row(0, named=True), base["chance"][0]
    excluded = fall_excluded(row["reference_only"], row["n"], row["acc_reference"] - chance)
    return [
        {
            "name": f"{model}: top {k} vs unmodified, mmlu_letter: a fall to chance",
            "kind": "verdict",
            "value": "excluded" if excluded else "not excluded",
            "n": row["n"],
            "lost": row["reference_only"],
            "gained": row["condition_only"],
        }
    ]


def _contrast(topk: pl.DataFrame, accuracies: pl.DataFrame, model: str, k: int, margin: float) -> list[dict]:
    """The one verdict on the study's contrast that the report's lead gives (gna.report.contrast_verdict),
    with its reason: 'not tested' where the letter format cannot be told from chance."""
    base = accuracies.filter(pl.col("task") == "mmlu_letter")
    if base.is_empty() or "chance" not in base.columns:
        return []
    letter = base.row(0, named=True)
    if not above_chance(letter["ci_low"], letter["chance"]):
        verdict = ("not tested", "the letter format cannot be told from chance")
    else:
        verdict = removal_verdict(topk, model, k, letter["chance"], margin)
    if verdict is None:
        return []
    return [{"name": f"{model}: the study's contrast (top {k} removed)", "kind": "label", "value": verdict[0],
             "reason": verdict[1]}]  # fmt: skip


def case_entries(folder: Path, model: str, margin: float) -> list[dict]:
    """The MMLU case study of `model` (its results `folder`, rules/case.smk): the minimal model's depth,
    the critical layers, the heads found, the heads-kept verdicts on the knowledge side and the one verdict
    on the study's contrast (gna.report.contrast_verdict.case_verdict); none where it did not run."""
    if not (folder / "minimal.json").is_file():
        return []
    case = CaseStudy(
        minimal=json.loads((folder / "minimal.json").read_text()),
        critical=json.loads((folder / "critical.json").read_text()),
        found=json.loads((folder / "found.json").read_text()),
        kept=_read(folder / "kept.comparisons.parquet"),
    )
    heads = ", ".join(f"L{h['layer']}H{h['head']}" for h in case.found["heads"]) or "none"
    out = [
        {"name": f"{model} case study: minimal model layers", "kind": "label",
         "value": str(case.minimal["layers_kept"] or "none")},
        {"name": f"{model} case study: critical layers", "kind": "label",
         "value": ", ".join(f"L{x}" for x in case.critical["layers"]) or "none"},
        {"name": f"{model} case study: heads found", "kind": "label", "value": heads},
    ]  # fmt: skip
    out += _verdicts(case.kept, f"{model} case study heads kept", margin, ("mmlu_letter", "mmlu_cloze", "facts_cloze"))
    state, reason = case_verdict(case, CASE_CHANCE, margin)
    out.append(
        {"name": f"{model}: the study's contrast (case study)", "kind": "label", "value": state, "reason": reason}
    )
    return out


def verdict(row: dict, margin: float) -> str:
    """The verdict of a comparisons row as the headline records it: the verb, a change smaller than
    the margin as its own verdict ("falls by less than ±5")."""
    d = decide(row, margin)
    return d.label if d.within else d.verb


def rounding_items(n: int) -> int:
    """How many of n items the CPU kinds' rounding may move (ROUNDING_SHARE, one at least)."""
    return max(1, math.ceil(ROUNDING_SHARE * n))


def reachable(entry: dict, target: str, margin: float) -> bool:
    """Whether a verdict entry's table, with at most rounding_items(n) items moved between concordant
    and lost or gained (each move changes one count by one), gives the verdict `target`. The
    family's other rows are held fixed: the moved row's Holm p is its raw p times its Holm
    multiplier, and never below the recorded Holm p where that came from an earlier row (Holm's
    adjusted values are monotone), so the unmoved table gives the recorded verdict."""
    n, moves = entry["n"], rounding_items(entry["n"])
    if not n:
        return False
    own = entry["p_mcnemar"] * entry["holm_multiplier"]
    floor = entry["p_holm"] if entry["p_holm"] > own * (1 + 1e-9) else 0.0
    for d_lost in range(-moves, moves + 1):
        for d_gained in range(-(moves - abs(d_lost)), moves - abs(d_lost) + 1):
            lost, gained = entry["lost"] + d_lost, entry["gained"] + d_gained
            if lost < 0 or gained < 0 or lost + gained > n:
                continue
            p = mcnemar_p(lost, gained)
            row = {
                "n": n,
                "reference_only": lost,
                "condition_only": gained,
                "diff": (gained - lost) / n,
                "p_mcnemar": p,
                "p_holm": min(1.0, max(floor, p * entry["holm_multiplier"])),
                "holm_multiplier": entry["holm_multiplier"],
            }
            if verdict(row, margin) == target:
                return True
    return False


def borderline(ref: dict, new: dict, margin: float) -> bool:
    """A changed verdict the CPU kinds' rounding can make: either run's table, moved by at most
    rounding_items, gives the other's verdict (False where an entry lacks its counts: an older record)."""
    keys = ("n", "lost", "gained", "p_mcnemar", "p_holm", "holm_multiplier")
    if not all(e.get(k) is not None for k in keys for e in (ref, new)) or ref["n"] != new["n"]:
        return False
    return reachable(ref, new["value"], margin) or reachable(new, ref["value"], margin)


def _counts(entry: dict) -> str:
    return f"{entry['lost']} lost / {entry['gained']} gained of {entry['n']}, Holm p = {entry['p_holm']:.2g}"


def _formats(formats: pl.DataFrame, model: str) -> list[dict]:
    """The format comparison's headline: whether the model answers any letter form on the development
    split (above chance, circular check included: gna.core.chance.answered), and the chosen form's
    accuracy on the evaluation split (the task's own draw)."""
    if formats.is_empty():
        return []
    dev = formats.filter((pl.col("split") == "dev") & (pl.col("answer") == "letter") & (pl.col("n") > 0))
    out = []
    if len(dev):
        answers = any(answered(row) for row in dev.iter_rows(named=True))
        out.append({"name": f"{model} a letter form answered", "kind": "label", "value": "yes" if answers else "no"})
    own = formats.filter((pl.col("split") == "eval") & (pl.col("draw") == 0))
    if len(own):
        row = own.row(0, named=True)
        out.append(_accuracy(f"{model} facts form {row['form']} (evaluation split)", row["acc"], row["n"]))
    return out


def provenance_entry(record: dict) -> dict:
    """Where a headline comes from, read from its run's record (gna.report.run_record's record.json):
    the commit, the CPU and its kernels, the cores and the date. `make check` does not compare it."""
    return {
        "name": "provenance",
        "kind": "provenance",
        "commit": record["git commit"][:7] + ("-dirty" if record["git commit"].endswith("-dirty") else ""),
        "cpu": f"{record['cpu']} ({record['kernels']})",
        "cores": record["cpu_count"],
        "date": record["written"],
    }


def headline(data_dir: str | Path, margin: float = DEFAULT_MARGIN) -> list[dict]:
    """The headline entries of the finished run in `data_dir` (its data/ folder): per teacher the
    baseline accuracies, the top-ranked head, the minimal model's depth, the top-k removal's
    accuracies and verdicts, the heads-kept and masking verdicts, and the students' KV accuracies
    and verdicts. Entries of results the run does not have are left out."""
    data = Path(data_dir)
    baseline = _read(data / "results" / "baseline.parquet")
    if baseline.is_empty():
        raise FileNotFoundError(f"{data / 'results' / 'baseline.parquet'}: no finished run there")
    out = []
    acc = baseline.filter((pl.col("metric") == "acc") & (pl.col("group") == "all"))
    if "engine" in acc.columns:
        acc = acc.filter(pl.col("engine") == "gna")
    for row in acc.sort(["model", "task"]).iter_rows(named=True):
        out.append(_accuracy(f"{row['model']} baseline {row['task']}", row["value"], row["n"]))
    for model in sorted(acc["model"].unique()):
        heads, prune = data / "results" / "heads" / model, data / "results" / "prune" / model
        ranking = _read(heads / "ranking.parquet")
        if not ranking.is_empty():
            top = ranking.sort("rank").row(0, named=True)
            # a key/value group where the ranking ranks groups (heads.sweep_unit: group): L13G0
            letter = "G" if top.get("unit") == "group" else "H"
            out.append(
                {"name": f"{model} top-ranked head", "kind": "label", "value": f"L{top['layer']}{letter}{top['head']}"}
            )
        minimal = prune / "minimal_model.json"
        if minimal.is_file():
            layers = len(json.loads(minimal.read_text())["kept_layers"])
            out.append({"name": f"{model} minimal model layers", "kind": "label", "value": str(layers)})
        topk = _read(heads / "topk.comparisons.parquet")
        if not topk.is_empty():
            removal = topk.filter(pl.col("family") == "top k vs unmodified")
            k = knowledge_k(removal["condition"].unique().to_list())
            if k is not None:
                chosen = removal.filter(pl.col("condition") == f"top {k}")
                for row in chosen.filter(pl.col("group") == "all").sort("task").iter_rows(named=True):
                    out.append(_accuracy(f"{model} top {k} removed {row['task']}", row["acc_condition"], row["n"]))
                out += _verdicts(chosen, model, margin)
                out += _fall_to_chance(chosen, acc.filter(pl.col("model") == model), model, k)
                if not (data / "results" / "case" / model / "minimal.json").is_file():  # one verdict per model
                    out += _contrast(topk, acc.filter(pl.col("model") == model), model, k, margin)
                subsets = topk.filter(
                    (pl.col("family") == "top k vs unmodified" + SUBSETS) & (pl.col("condition") == f"top {k}")
                )
                out += _verdicts(subsets, model, margin, ("facts_cloze",), NOT_COPYABLE)
                out += _verdicts(
                    topk.filter((pl.col("family") == "top k vs random k") & (pl.col("condition") == f"top {k}")),
                    model,
                    margin,
                )
                # the control: as many heads drawn at random (its first draw, as the contrast reads it)
                out += _verdicts(
                    topk.filter(
                        (pl.col("family") == "random k vs unmodified") & (pl.col("condition") == f"random {k} #0")
                    ),
                    model,
                    margin,
                )
        out += case_entries(data / "results" / "case" / model, model, margin)
        out += _formats(_read(data / "results" / "facts" / model / "formats.parquet"), model)
        out += _verdicts(_read(heads / "kept.comparisons.parquet"), f"{model} heads kept", margin, ("kv_retrieval",))
        gna = data / "results" / "gna" / model / "masking.comparisons.parquet"
        out += _verdicts(_read(gna), f"{model} G&A masking", margin, None)
        hybrid = data / "results" / "hybrid" / model
        for path in sorted(hybrid.glob("*.parquet")):
            if path.stem != TEACHER_VARIANT and not re.fullmatch(VARIANT_PATTERN, path.stem):
                continue  # the budget curve, ablations, memory, comparisons: not a student's scores
            kv = (
                _read(path)
                .filter((pl.col("task") == "kv_retrieval") & (pl.col("group") == "all") & (pl.col("metric") == "acc"))
                .filter(pl.col("value").is_not_null())
            )
            if len(kv):
                row = kv.row(0, named=True)
                out.append(_accuracy(f"{model} student {path.stem} kv_retrieval", row["value"], row["n"]))
        students = _read(hybrid / "comparisons.parquet")
        if not students.is_empty():
            out += _verdicts(
                students.filter(pl.col("family") != "more heads kept vs fewer"), f"{model} students", margin
            )
    record = data / "run" / "record.json"
    if record.is_file():
        out.append(provenance_entry(json.loads(record.read_text())))
    return out


def compare(reference: list[dict], run: list[dict], margin: float = DEFAULT_MARGIN) -> tuple[list[str], bool]:
    """One line per reference entry: 'equal', 'within its interval' (an accuracy inside the
    recorded 95% interval), 'within rounding' (at most rounding_items of its items apart),
    'borderline' (a verdict the rounding can flip: `borderline`, with both runs' counts and
    p-values), 'differs' / 'verdict changed' with both values, or 'missing'; and whether the run
    reproduced (no number differs, no verdict changed, nothing missing)."""
    got = {entry["name"]: entry for entry in run}
    lines, ok = [], True
    failed = {"verdict": 0, "number": 0}  # entries that differ, changed or are missing, by kind
    reference = [ref for ref in reference if ref["kind"] != "provenance"]  # where, not what
    for ref in reference:
        new = got.get(ref["name"])
        kind = "verdict" if ref["kind"] == "verdict" else "number"
        if new is None:
            lines.append(f"missing    {ref['name']}")
            failed[kind] += 1
            ok = False
            continue
        if ref["kind"] == "accuracy":
            a, b = ref["value"], new["value"]
            text = f"{100 * a:.1f}% [{100 * ref['ci'][0]:.0f}–{100 * ref['ci'][1]:.0f}] n={ref['n']} → {100 * b:.1f}%"
            if a == b:
                lines.append(f"equal      {ref['name']}: {text}")
            elif ref["ci"][0] <= b <= ref["ci"][1]:
                lines.append(f"within     {ref['name']}: {text} (within its interval)")
            elif new["n"] == ref["n"] and round(abs(a - b) * ref["n"]) <= rounding_items(ref["n"]):
                items = round(abs(a - b) * ref["n"])
                lines.append(
                    f"rounding   {ref['name']}: {text} ({items} of {ref['n']} items: within the CPU kinds' rounding)"
                )
            else:
                lines.append(f"DIFFERS    {ref['name']}: {text}")
                failed[kind] += 1
                ok = False
        elif ref["value"] == new["value"]:
            lines.append(f"equal      {ref['name']}: {ref['value']}")
        elif ref["kind"] == "verdict" and borderline(ref, new, margin):
            lines.append(
                f"borderline {ref['name']}: {ref['value']} ({_counts(ref)}) → {new['value']} ({_counts(new)}): "
                f"moving at most {rounding_items(ref['n'])} of its items gives the other verdict"
            )
        else:
            what = "VERDICT CHANGED" if ref["kind"] == "verdict" else "DIFFERS   "
            lines.append(f"{what} {ref['name']}: {ref['value']} → {new['value']}")
            failed[kind] += 1
            ok = False
    verdicts = [r for r in reference if r["kind"] == "verdict"]
    near = sum(1 for line in lines if line.startswith("borderline"))
    lines.append(
        f"reproduced: {len(reference)} headline entries, every number equal, within its interval or within "
        f"rounding, and {len(verdicts) - near} of {len(verdicts)} verdicts the same"
        + (f", {near} borderline (next to their threshold on either run)" if near else "")
        if ok
        else f"NOT reproduced: {failed['number']} of {len(reference) - len(verdicts)} numbers differ or are "
        f"missing, {failed['verdict']} of {len(verdicts)} verdicts changed or missing"
    )
    return lines, ok


def headline_text(entries: list[dict]) -> str:
    """The headline file's text: one entry a line, so that a reviewer reads a change in a diff."""
    return "[\n" + ",\n".join(json.dumps(e, ensure_ascii=False) for e in entries) + "\n]\n"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 3 or args[0] not in ("write", "check"):
        print(__doc__, file=sys.stderr)
        return 2
    if args[0] == "write":
        data, out = args[1], Path(args[2])
        entries = headline(data)
        out.write_text(headline_text(entries))
        print(f"wrote {len(entries)} headline entries of {data} to {out}")
        return 0
    if not Path(args[1]).is_file():
        print(
            f"{args[1]}: no headline recorded to compare with (`make headline` writes it from a run)", file=sys.stderr
        )
        return 2
    try:
        run = headline(args[2])
    except FileNotFoundError as error:
        print(error, file=sys.stderr)
        return 2
    lines, ok = compare(json.loads(Path(args[1]).read_text()), run)
    print("\n".join(lines))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
