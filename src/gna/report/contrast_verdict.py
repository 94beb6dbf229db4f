"""One verdict on the study's contrast per model, never stronger than its premise (contrast_state):
the report's contrast section, the headline (`make check`) and docs/findings.md read the same one."""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from gna.core.paired import ALPHA, comparison_row, decide, fall_excluded, share_upper_bound
from gna.core.stats import wilson_interval

# the states of the verdict on the study's contrast, in the order they are decided
STATES = ("not tested", "reproduced", "contradicted", "not reproduced", "undecided")


@dataclass(frozen=True)
class ContrastRows:
    """The paired rows of one removal that the verdict reads (comparisons-table rows, gna.core.paired):
    the letter format, facts cloze, MMLU cloze, and the random control's own removal on the letter format."""

    letter: dict
    facts: dict | None = None
    cloze: dict | None = None
    control: dict | None = None


def contrast_state(
    rows: ContrastRows, *, premise_fails: str | None, carries_retrieval: bool, chance: float, margin: float
) -> tuple[str, str]:
    """(state, reason): one verdict on the study's contrast from the paired rows of one removal, decided
    in the order of STATES, never stronger than its premise.

    - not tested: `premise_fails` names why (the letter format at chance, no units shown to carry the
      mechanism, ...);
    - reproduced: the letter format falls with the removal's interval reaching `chance`, facts cloze
      holds within the margin, MMLU cloze and the random control are not shown to fall;
    - contradicted: a fall to chance is excluded and the units removed are shown to carry retrieval;
    - not reproduced: a fall to chance is excluded;
    - undecided: anything else.
    """
    letter, facts, cloze, control = rows.letter, rows.facts, rows.cloze, rows.control
    if premise_fails:
        return "not tested", premise_fails
    n = letter["n"]
    # what "reproduced" needs, each with what stands in its way; the removal's own accuracy interval
    # (Wilson) must reach chance
    unmet = {
        "the letter format is not shown to fall": decide(letter, margin).verb != "falls",
        "the letter format's interval stays above chance": wilson_interval(round(letter["acc_condition"] * n), n)[0]
        > chance,
        "facts cloze is not shown to hold": facts is None or decide(facts, margin).verb != "holds",
        "MMLU cloze falls": cloze is not None and decide(cloze, margin).verb == "falls",
        "the random control falls too": control is not None and decide(control, margin).verb == "falls",
    }
    if not any(unmet.values()):
        return "reproduced", (
            f"the letter format falls to chance ({100 * letter['acc_reference']:.1f}% → "
            f"{100 * letter['acc_condition']:.1f}%, n = {n}) while facts cloze holds within ±{100 * margin:g} points, "
            "MMLU cloze and the random control are not shown to fall"
        )
    excluded = fall_excluded(letter["reference_only"], n, letter["acc_reference"] - chance)
    bound = f"at most {100 * share_upper_bound(letter['reference_only'], n):.1f}% of {n} letter items lost"
    if excluded and carries_retrieval:
        return "contradicted", (
            f"this contradicts the study: a fall to chance is excluded ({bound}) though the units removed are shown to "
            "carry retrieval"
        )
    if excluded:
        return "not reproduced", f"a fall to chance is excluded ({bound})"
    why = "; ".join(reason for reason, stands in unmet.items() if stands)
    return "undecided", f"not reproduced as the study reports it ({why}), and a fall to chance is not excluded"


def removal_premise(compared: pl.DataFrame, model: str, k: int, margin: float) -> tuple[str | None, bool]:
    """(why the premise fails or None, whether the units carry retrieval) for the full-model removal of
    the top k: its KV retrieval must fall, item by item, for the units to be shown to carry retrieval."""
    kv = comparison_row(compared, "top k vs unmodified", "unmodified", f"top {k}", "kv_retrieval")
    if kv is None:
        return "no KV retrieval was scored with the units removed", False
    verdict = decide(kv, margin)
    if verdict.verb == "falls" and not verdict.within:  # a fall smaller than the margin carries little of it
        return None, True
    return (
        f"the units removed are not shown to carry retrieval (KV {100 * kv['acc_reference']:.1f}% → "
        f"{100 * kv['acc_condition']:.1f}%, {kv['reference_only']} lost / {kv['condition_only']} gained of {kv['n']}: "
        f"{verdict.verb})"
    ), False


def removal_verdict(compared: pl.DataFrame, model: str, k: int, chance: float, margin: float) -> tuple[str, str] | None:
    """contrast_state of the full-model removal of the top k of `model` (its remove-top-k comparisons),
    None where the letter format was not compared."""
    sub = compared.filter(pl.col("model") == model)

    def row(family, condition, task):
        return comparison_row(sub, family, "unmodified", condition, task)

    letter = row("top k vs unmodified", f"top {k}", "mmlu_letter")
    if letter is None:
        return None
    premise, carries = removal_premise(sub, model, k, margin)
    rows = ContrastRows(
        letter,
        facts=row("top k vs unmodified", f"top {k}", "facts_cloze"),
        cloze=row("top k vs unmodified", f"top {k}", "mmlu_cloze"),
        control=row("random k vs unmodified", f"random {k} #0", "mmlu_letter"),
    )
    return contrast_state(rows, premise_fails=premise, carries_retrieval=carries, chance=chance, margin=margin)


@dataclass(frozen=True)
class CaseStudy:
    """What the MMLU case study of one model left (rules/case.smk): the minimal model, the critical layers
    and the heads found (their JSON records), and the heads-kept comparisons."""

    minimal: dict
    critical: dict
    found: dict
    kept: pl.DataFrame


def _kv_rows(kept: pl.DataFrame, condition: str) -> pl.DataFrame:
    """The heads-kept comparisons of `condition` against the kept configuration on KV retrieval, one per size."""
    return kept.filter(
        (pl.col("family") == "vs kept configuration")
        & (pl.col("condition") == condition)
        & pl.col("task").str.starts_with("kv_retrieval")
        & (pl.col("group") == "all")
    )


def carries_retrieval(kept: pl.DataFrame, condition: str, margin: float) -> bool:
    """Whether removing a head from the kept configuration (`condition`) is shown to cost KV retrieval at
    some dictionary size: its accuracy falls beyond the margin (as removal_premise reads the top-k removal).
    The answer's log-prob is not enough: any change to a critical layer's attention moves it (the random
    head kept in the found head's place lowers it as often)."""
    for row in _kv_rows(kept, condition).iter_rows(named=True):
        verdict = decide(row, margin)
        if verdict.verb == "falls" and not verdict.within:
            return True
    return False


def case_verdict(case: CaseStudy, chance: float, margin: float) -> tuple[str, str]:
    """contrast_state of the case study: the removal of a head found from the kept configuration whose
    letter format falls most, with facts cloze and MMLU cloze under the same removal and the random head
    of the same layer removed from all heads as the control. Not tested where the minimal model, the
    critical layers or the heads found are missing (their reason) or the kept configuration itself is
    at chance on the letter format."""
    for step in (case.minimal, case.critical, case.found):
        if step.get("reason"):
            return "not tested", step["reason"]
    kept = case.kept

    def row(family, reference, condition, task):
        return comparison_row(kept, family, reference, condition, task)

    removals = []
    for head in case.found["heads"]:
        label = f"kept − L{head['layer']}H{head['head']}"
        letter = row("vs kept configuration", "kept", label, "mmlu_letter")
        if letter is not None:
            removals.append((letter["diff"], head, label, letter))
    if not removals:
        return "not tested", "no head found was removed from the kept configuration on MMLU letter"
    _, head, label, letter = min(removals, key=lambda r: r[0])
    n = letter["n"]
    if wilson_interval(round(letter["acc_reference"] * n), n)[0] <= chance:
        return "not tested", (
            f"the kept configuration's letter accuracy ({100 * letter['acc_reference']:.1f}%, n = {n}) cannot be told "
            "from chance, so no removal from it can show a fall"
        )
    layer = head["layer"]
    controls = kept.filter(
        (pl.col("family") == "vs all heads")
        & pl.col("condition").str.starts_with(f"all heads − random L{layer}H")
        & (pl.col("task") == "mmlu_letter")
        & (pl.col("group") == "all")
    )
    rows = ContrastRows(
        letter,
        facts=row("vs kept configuration", "kept", label, "facts_cloze"),
        cloze=row("vs kept configuration", "kept", label, "mmlu_cloze"),
        control=controls.row(0, named=True) if len(controls) else None,
    )
    state, reason = contrast_state(
        rows, premise_fails=None, carries_retrieval=carries_retrieval(kept, label, margin), chance=chance, margin=margin
    )
    removed = (
        f"L{layer}H{head['head']} removed from the kept configuration (layer {layer} left without attention heads)"
    )
    return state, f"{removed}: {reason}" + swap_clause(kept, head, margin) + confidence_clause(kept, label, margin)


def confidence_clause(kept: pl.DataFrame, condition: str, margin: float) -> str:
    """Where the removal lowers the KV answer's log-prob (sign test, Holm) without KV accuracy falling: a
    clause saying that this does not show the head carries retrieval; '' otherwise."""
    if carries_retrieval(kept, condition, margin):
        return ""
    rows = _kv_rows(kept, condition).filter(
        (pl.col("p_logp_holm") < ALPHA) & (pl.col("logp_lower") > pl.col("logp_higher"))
    )
    if rows.is_empty():
        return ""
    return (
        f"; KV accuracy does not fall, though the answer's log-prob is lower at {len(rows)} dictionary size(s) "
        "(a lower confidence is not shown retrieval: see the random head kept in its place)"
    )


def swap_clause(kept: pl.DataFrame, head: dict, margin: float) -> str:
    """Whether the head found matters as itself: the kept configuration with a random other head of its layer
    kept in its place, against the kept configuration on the letter format (its first draw); '' where not run."""
    rows = kept.filter(
        (pl.col("family") == "vs kept configuration")
        & pl.col("condition").str.starts_with(f"kept, L{head['layer']}H")
        & pl.col("condition").str.contains(f" in place of H{head['head']} #0", literal=True)
        & (pl.col("task") == "mmlu_letter")
        & (pl.col("group") == "all")
    )
    if rows.is_empty():
        return ""
    row = rows.row(0, named=True)
    other = row["condition"].split(", ")[1].split(" in place")[0]
    return (
        f"; with {other} kept in its place instead, the letter format {decide(row, margin).label} "
        f"({100 * row['acc_reference']:.1f}% → {100 * row['acc_condition']:.1f}%)"
    )
