"""Per-sample Gather-and-Aggregate masking (attention heads).

For one Gather head and one Aggregate head, three conditions are scored:
  (a) the unmodified model;
  (b) both heads ablated (their outputs zeroed);
  (c) both heads restricted to their G&A pattern, per sample: the Gather head's query rows
      inside a segment (its tokens and its summary token) see only that segment; the Aggregate
      head's answer rows (the last context token and the choice tokens) see only the segments;
      every other row of these two heads sees only itself.
If (c) stays near (a) while (b) falls, the G&A pattern alone carries the retrieval.
Masks are per head ([batch, heads, T, T]) on the packed sequences of gna.engine.packing; every other
head keeps the ordinary mask. `restrict=False` builds the same per-head masks without any
restriction — a test checks that it reproduces the unmasked logits.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import polars as pl
import torch

from gna.core.chance import NO_REFERENCE, SKIPPED, ChancePolicy, Reference
from gna.core.io import read_parquet, write_parquet
from gna.core.paired import comparisons, empty
from gna.core.settings import Evaluation, Files, RuleSettings
from gna.engine.ablation import score_ablations
from gna.engine.anatomy import decoder_layers
from gna.engine.packing import PackedBatch
from gna.engine.scoring import Scorer, Variant, accuracy_of, known_or_scored, score_table
from gna.phases.gather_aggregate import ROLES, Segments, best_role_head, kv_row_segments, mmlu_row_segments
from gna.students.mixer import mixers, ssm_heads_of
from gna.students.spec import load_any
from gna.tasks.tables import load_item_scores, load_task_tables

log = logging.getLogger("gna.phases.masking")
CONDITIONS = ("(a) unmodified", "(b) G&A heads ablated", "(c) G&A pattern only")
RESULT_SCHEMA = {
    "condition": pl.String,
    "heads": pl.String,
    "task": pl.String,
    "acc": pl.Float64,
    "mean_logp": pl.Float64,
    "n": pl.Int64,
    "ci_low": pl.Float64,
    "ci_high": pl.Float64,
    SKIPPED: pl.String,
}


class Segmented(NamedTuple):
    """A table whose items are cut into segments: `table` and `segments(tok, row) -> Segments`
    (gna.phases.gather_aggregate's kv_row_segments, mmlu_row_segments)."""

    table: pl.DataFrame
    segments: Callable


def head_mask(
    batch: PackedBatch, segs: list[Segments], n_heads: int, head: int, role: str, restrict: bool = True
) -> torch.Tensor:
    """[B, n_heads, T, T] additive mask: the ordinary packed mask, with `head` restricted to its role."""
    mask = batch.mask.expand(-1, n_heads, -1, -1).clone()
    if not restrict:
        return mask
    blocked = torch.finfo(mask.dtype).min
    T = mask.shape[-1]
    for b, (item, seg) in enumerate(zip(batch.items, segs)):
        allowed = torch.eye(T, dtype=torch.bool, device=mask.device)
        if role == "gather":
            for (start, end), summary in zip(seg.spans, seg.summary):
                keys = list(range(start, end)) + [summary]
                for row in keys:
                    allowed[row, keys] = True
        elif role == "aggregate":
            keys = [t for (start, end) in seg.spans for t in range(start, end)] + list(seg.summary)
            rows = [seg.answer] + [p for p, s in enumerate(item.segment) if s >= 0]
            for row in rows:
                allowed[row, keys] = True
        else:
            raise ValueError(f"unknown G&A role {role!r}; allowed: gather, aggregate")
        mask[b, head].masked_fill_(~allowed, blocked)
    return mask


def pattern_masks(scorer: Scorer, items: Segmented, heads: dict[str, tuple[int, int]], restrict: bool = True):
    """The layer masks (gna.engine.scoring.LayerMasks) that restrict the heads {'gather': (layer,
    head), 'aggregate': (layer, head)} to their G&A pattern on each item's segments of `items`."""
    table, segment_fn, tok = items.table, items.segments, scorer.tok
    n_heads = scorer.model.config.num_attention_heads
    rows_of = list(table.iter_rows(named=True))

    def layer_masks(batch, rows):
        segs = [segment_fn(tok, rows_of[i]) for i in rows]
        for i, seg, item in zip(rows, segs, batch.items):
            if len(seg.tokens) != item.context_length:
                raise ValueError(
                    f"item {i}: segments were found on {len(seg.tokens)} tokens but the "
                    f"context has {item.context_length} (a BOS token or trailing space?)"
                )
        masks: dict[int, torch.Tensor] = {}
        for role, (layer, head) in heads.items():
            base = masks.get(layer)
            m = head_mask(batch, segs, n_heads, head, role, restrict)
            masks[layer] = m if base is None else torch.minimum(base, m)  # both restrictions
        return masks

    return layer_masks


def score_masked(
    scorer: Scorer, items: Segmented, heads: dict[str, tuple[int, int]], restrict: bool = True
) -> pl.DataFrame:
    """Score the table of `items` with the heads {'gather': (layer, head), 'aggregate': (layer,
    head)} restricted to their G&A pattern on each item's segments (pattern_masks), in a pass of
    its own (the reference of pattern_variant)."""
    return score_table(scorer, items.table, layer_masks=pattern_masks(scorer, items, heads, restrict))


def pattern_variant(scorer: Scorer, items: Segmented, heads: dict[str, tuple[int, int]]) -> Variant:
    """Condition (c) as a variant of the unmodified model (gna.engine.scoring.Variant): it resumes
    at the first masked layer with the pattern_masks from there, so a pass that scores (a) and (b)
    scores it too; the same scores as score_masked, bit for bit (tested)."""
    first = min(layer for layer, _ in heads.values())
    n_layers = len(decoder_layers(scorer.model))
    return Variant(CONDITIONS[2], first, list(range(first, n_layers)), layer_masks=pattern_masks(scorer, items, heads))


def heads_label(heads: dict[str, tuple[int, int]], ssm_heads: set[tuple[int, int]] | None = None) -> str:
    """'gather L1H2, aggregate L3H0'; with `ssm_heads` (a student's) each head also says whether
    it runs as an SSM or an attention head: 'gather L1H2 (ssm), aggregate L3H0 (attention)'."""

    def kind(head):
        return "" if ssm_heads is None else f" ({'ssm' if head in ssm_heads else 'attention'})"

    return ", ".join(f"{role} L{layer}H{head}{kind((layer, head))}" for role, (layer, head) in heads.items())


def _condition_row(condition: str, label: str, items: pl.DataFrame, reason: str | None = None) -> dict:
    return {"condition": condition, "heads": label, "task": items["task"][0], **accuracy_of(items), SKIPPED: reason}


def _ssm_heads(model) -> set[tuple[int, int]] | None:
    """A student's SSM heads (gna.students.mixer); None for a model without mixers."""
    return ssm_heads_of(model) if mixers(model) else None


def masking_experiment(
    scorer: Scorer,
    retrieval: Segmented,
    heads: dict[str, tuple[int, int]],
    knowledge: pl.DataFrame | list[pl.DataFrame] | None = None,
    reference: Reference = NO_REFERENCE,
    per_item: dict[str, list[pl.DataFrame]] | None = None,
) -> pl.DataFrame:
    """acc and mean log-prob of the target under (a) unmodified, (b) ablated, (c) G&A-only, on the
    `retrieval` table (with its segments); on `knowledge` (a table or several, e.g. MMLU and
    facts cloze, which have no segments) (a) and (b) only.
    The heads column is heads_label(heads, the student's SSM heads where the model is one).
    `reference` is the unmodified model: by its `chance` policy, where (a) cannot be told from
    chance no condition can show a loss, so the retrieval table's (c) and the knowledge table's
    (b) are not run; (a)'s skipped_reason says why. (a), (b) and (c) of the retrieval table come
    from one pass (pattern_variant; (c) dropped where (a) is at chance); the knowledge table's (a)
    is scored first (one more pass where it is above chance), or read from its `scored` {task:
    the model's per-item scores} where they hold its items. `per_item`, where given, receives each
    condition's per-item scores, appended to its list (masking_comparisons)."""
    table, chance = retrieval.table, reference.chance

    def plain_and_ablated(
        items: pl.DataFrame, with_plain: bool = True, more: tuple[Variant, ...] = ()
    ) -> list[tuple[str, pl.DataFrame, None]]:
        # one pass: (b) (and `more`) rerun only the layers from their first head's on (exact prefix reuse)
        wanted = {CONDITIONS[1]: list(heads.values())}
        if with_plain:
            wanted = {CONDITIONS[0]: [], **wanted}
        frames = score_ablations(scorer, items, wanted, more=more)
        return [(condition, frame, None) for condition, frame in frames.items()]

    def left_out_because(unmodified: pl.DataFrame, items: pl.DataFrame, left_out: str) -> str | None:
        reason = chance.reason(unmodified, items, "masking heads")
        if reason is not None:
            log.info("%s: %s not run, (a) %s", items["task"][0], left_out, reason)
            return f"{reason}: {left_out} not run"
        return None

    # (c) in the same pass, dropped where (a) turns out to be at chance
    results = plain_and_ablated(table, more=(pattern_variant(scorer, retrieval, heads),))
    reason = left_out_because(results[0][1], table, "(c)")
    if reason is not None:
        results = [(*results[0][:2], reason), results[1]]
    for items in [knowledge] if isinstance(knowledge, pl.DataFrame) else knowledge or []:
        if not len(items):
            continue
        if chance.applies(items["task"][0]):  # (a) first, then (b) only where it can show a loss
            unmodified = known_or_scored(scorer, items, reference.scores_of(items["task"][0]))
            reason = left_out_because(unmodified, items, "(b)")
            results.append((CONDITIONS[0], unmodified, reason))
            if reason is None:
                results += plain_and_ablated(items, with_plain=False)
        else:
            results += plain_and_ablated(items)
    label = heads_label(heads, _ssm_heads(scorer.model))
    if per_item is not None:
        for condition, items, _ in results:
            per_item.setdefault(condition, []).append(items)
    return pl.DataFrame(
        [_condition_row(condition, label, items, reason) for condition, items, reason in results], schema=RESULT_SCHEMA
    )


def masking_comparisons(per_item: dict[str, list[pl.DataFrame]]) -> pl.DataFrame:
    """(b) and (c) each against (a) on the same items (gna.core.paired), one Holm family."""
    frames = {condition: pl.concat(parts, how="diagonal_relaxed") for condition, parts in per_item.items()}
    return comparisons(frames, [("masking vs unmodified", CONDITIONS[0], condition) for condition in CONDITIONS[1:]])


def choice_masking(
    scorer: Scorer,
    letter: pl.DataFrame,
    heads: dict[str, tuple[int, int]],
    min_acc: float,
    reference: Reference = NO_REFERENCE,
    per_item: dict[str, list[pl.DataFrame]] | None = None,
) -> pl.DataFrame:
    """masking_experiment on a multiple-choice table (MMLU letter, the facts' choice form; option
    lines as segments) for a model above `min_acc` there (and, by the `reference`'s chance
    policy, whose accuracy is distinguishable from chance); otherwise only the unmodified row, its
    skipped_reason saying that (b) and (c) were not run. The gate reads the model's per-item
    scores from the `reference`'s scored ones where they hold the table's items (the experiment
    itself scores (a) with (b) in one pass)."""
    chance = reference.chance
    plain = known_or_scored(scorer, letter, reference.scores_of(letter["task"][0]))
    acc = float(plain["correct"].mean())
    reason = f"at chance (< {min_acc:.0%})" if acc < min_acc else None
    if reason is None:
        reason = chance.reason(plain, letter, "masking heads")
    if reason is not None:
        log.info("%s accuracy %.3f: (b) and (c) not run, %s", letter["task"][0], acc, reason)
        label = heads_label(heads, _ssm_heads(scorer.model))
        row = _condition_row(CONDITIONS[0], label, plain, f"{reason}: (b), (c) not run")
        if per_item is not None:
            per_item.setdefault(CONDITIONS[0], []).append(plain)
        return pl.DataFrame([row], schema=RESULT_SCHEMA)
    return masking_experiment(
        scorer, Segmented(letter, mmlu_row_segments), heads, reference=Reference(chance=chance), per_item=per_item
    )


def masking_heads(roles: pl.DataFrame) -> dict[str, tuple[int, int]]:
    """{role: (layer, head)} of the best-ranked Gather and Aggregate heads of a roles table
    (gather_aggregate.run_gna_roles); a role no head was classified as is left out."""
    best = {role: best_role_head(roles, role) for role in ROLES}
    return {role: head for role, head in best.items() if head is not None}


@dataclass(frozen=True)
class GnaMaskingConfig:
    """The masking's keys of config section gna: the items of each knowledge (cloze) and
    multiple-choice table scored (`knowledge_items`: gna.knowledge_items), and the accuracy a
    model needs on a multiple-choice table for its masking to run (`mmlu_min_acc`:
    gna.mmlu_min_acc; choice_masking)."""

    knowledge_items: int | None = 60
    mmlu_min_acc: float = 0.3


@dataclass(frozen=True)
class GnaMasking(RuleSettings):
    """Settings of rule gna_masking: the `model` (wildcard), the masking's config keys (`gna`:
    GnaMaskingConfig), the `chance` policy (config block chance) and how the model is loaded and
    scored (`evaluation`)."""

    model: str
    gna: GnaMaskingConfig = GnaMaskingConfig()
    chance: ChancePolicy = ChancePolicy()
    evaluation: Evaluation = Evaluation()


def run_gna_masking(inputs: Files, outputs: Files, settings: GnaMasking) -> pl.DataFrame:
    """Phase gna_masking: masking_experiment with the masking_heads of the roles table on the KV
    prompts (data/tasks/prompts/gna_masking: not those the roles were found on) and the knowledge
    tasks (cloze tables, each cut to gna.knowledge_items), then choice_masking (gated by
    gna.mmlu_min_acc) on each multiple-choice table; `chance` leaves out the masked
    conditions where (a) is at chance; (a) of the knowledge and choice tables is read from
    the model's per-item scores (its baseline's; a student's answers) where they hold the items.
    A student (gna.students.mixer) labels its heads SSM or attention. Skipped (an empty table)
    unless both roles have a head.
    inputs: model, roles, prompts, optional knowledge, choice and scores (lists).
    outputs: summary (the conditions' accuracies), comparisons (masking_comparisons), each with a
    model column."""
    evaluation, gna, model_name = settings.evaluation, settings.gna, settings.model
    heads = masking_heads(read_parquet(inputs.roles))
    if len(heads) < 2:
        log.warning(
            "no %s head was classified, so the masking experiment (it needs both roles) is skipped",
            ", ".join(sorted(set(ROLES) - set(heads))),
        )
        result, per_item = pl.DataFrame(schema=RESULT_SCHEMA), {}
    else:
        per_item = {}
        model, tok = load_any(inputs.model, evaluation.dtype, compute_dtype=evaluation.compute_dtype)
        scorer = Scorer(model, tok, evaluation.batch_size, progress=False)
        table = read_parquet(inputs.prompts)
        knowledge = list(load_task_tables(inputs.get("knowledge", []), gna.knowledge_items).values())
        reference = Reference(scored=load_item_scores(list(inputs.get("scores", []))), chance=settings.chance)
        result = masking_experiment(
            scorer, Segmented(table, kv_row_segments), heads, knowledge, reference, per_item=per_item
        )
        for letter in load_task_tables(inputs.get("choice", []), gna.knowledge_items).values():
            letter_result = choice_masking(scorer, letter, heads, gna.mmlu_min_acc, reference, per_item=per_item)
            result = pl.concat([result, letter_result])
        for row in result.iter_rows(named=True):
            log.info("%s %s: acc %.3f, mean logp %.3f", row["task"], row["condition"], row["acc"], row["mean_logp"])
    write_parquet(result.with_columns(pl.lit(model_name).alias("model")), outputs.summary)
    compared = masking_comparisons(per_item) if per_item else empty()
    write_parquet(compared.with_columns(pl.lit(model_name).alias("model")), outputs.comparisons)
    return result
