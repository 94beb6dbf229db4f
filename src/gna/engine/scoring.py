"""The evaluation engine: log-likelihood of each choice after a context.

Fast path: one batch driver (`score_batches`) packs each item's context and all of its choices
into one sequence with a block attention mask (gna.engine.packing) — one sequence per choice
where a layer is recurrent (SSM) — batches them, and hands each batch to a forward function
that records one pass of the model's own decoder and reruns layers from it (gna.engine.stack,
which projects to the vocabulary only at scored positions). On it: `score_table` (optionally reading
out after several depths in one pass — gradual pruning — or with per-layer attention masks),
`score_variants` (resume from a cached hidden state: one layer removed, one head ablated), and
the gradient pass of gna.phases.head_ablation.attribution_scores.
Slow reference (`score_table_ref`): the model's own forward on context+choice, one choice at a
time, logits everywhere. Tests keep the two equal.

Tokenisation follows lm-eval: context ids = encode(context); choice ids =
encode(context + choice)[len(context ids):], so the model sees context ids + choice ids.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import polars as pl
import torch
from tqdm.auto import tqdm

from gna.core.chance import DEGENERACY_METRIC, DEGENERATE_AGREEMENT
from gna.core.stats import wilson_exprs, wilson_interval
from gna.engine.anatomy import UnsupportedModel, decoder_layers, family_of
from gna.engine.device import device_of
from gna.engine.packing import PackedBatch, PackedItem, collate, pack, pack_tree
from gna.engine.stack import DecoderStack, check_engine, reference_scores


@dataclass(frozen=True)
class Scorer:
    """A model ready to be scored: the model, its tokenizer, the items per forward (eval.batch_size),
    whether progress bars show and whether the last layer computes only the rows read out. What
    every scoring function takes first."""

    model: Any
    tok: Any
    batch_size: int = 8
    progress: bool = True
    # the last layer of a pass computes its MLP and attention output projection at the read rows
    # only (DecoderStack.read_rows_only, within rounding of the full layer); False: every position
    read_rows_only: bool = True


@dataclass
class Encoded:
    context: list[int]
    choices: list[list[int]]


def starts_with_bos(tok) -> bool:
    """Whether the tokenizer puts BOS before a text by default, as the model's users and lm-eval
    (add_bos_token unset) tokenize it: Gemma's and Llama 3's post-processors do, whatever the
    tokenizer's `add_bos_token` attribute says; SmolLM2's does not."""
    if tok.bos_token_id is None:
        return False
    with_special, plain = tok("a")["input_ids"], tok("a", add_special_tokens=False)["input_ids"]
    return with_special[:1] == [tok.bos_token_id] and plain[:1] != [tok.bos_token_id]


def encode(tok, context: str, choices: list[str], bos: bool | None = None) -> Encoded:
    """Context and choice ids; BOS first where the tokenizer puts it (`bos`, default
    starts_with_bos)."""
    bos = starts_with_bos(tok) if bos is None else bos
    # lm-eval moves trailing context whitespace into the continuation
    n_space = len(context) - len(context.rstrip())
    if n_space:
        choices = [context[-n_space:] + c for c in choices]
        context = context[:-n_space]
    ctx = tok(context, add_special_tokens=False)["input_ids"]
    if bos:
        ctx = [tok.bos_token_id] + ctx
    conts = []
    for choice in choices:
        whole = tok(context + choice, add_special_tokens=False)["input_ids"]
        offset = len(ctx) - (1 if bos else 0)
        cont = whole[offset:]
        if not cont:
            raise ValueError(f"choice {choice!r} encodes to no tokens after context")
        conts.append(cont)
    if not ctx:
        raise ValueError("empty context")
    return Encoded(ctx, conts)


# item attributes a task table may carry that comparisons split by (the facts' relation and
# whether the answer can be copied from the subject): in every per-item frame, null where the
# table has none, so that frames of different tasks stack
ITEM_ATTRIBUTES = {"relation": pl.String, "copyable": pl.Boolean}


def per_item_frame(table: pl.DataFrame, scores: list) -> pl.DataFrame:
    """One row per item of `table` from its scores [(summed log-prob per choice, greedy flag per
    choice)]: the prediction (argmax), its byte-length-normalised twin, correctness, whether greedy
    decoding reproduces the target, every choice's log-prob, and the table's ITEM_ATTRIBUTES."""
    rows = []
    for row, (totals, greedy) in zip(table.iter_rows(named=True), scores):
        target = row["target"]
        pred = max(range(len(totals)), key=totals.__getitem__)
        norm = [t / max(len(c.encode()), 1) for t, c in zip(totals, row["choices"])]
        pred_norm = max(range(len(norm)), key=norm.__getitem__)
        rows.append(
            {
                "task": row["task"],
                "item_id": row["item_id"],
                "group": row["group"],
                "target": target,
                "pred": pred,
                "correct": pred == target,
                "pred_norm": pred_norm,
                "correct_norm": pred_norm == target,
                "greedy_match": greedy[target],
                "logp_target": totals[target],
                "logprobs": totals,
                **{a: row.get(a) for a in ITEM_ATTRIBUTES},
            }
        )
    return pl.DataFrame(rows, schema_overrides=ITEM_ATTRIBUTES)


def known_items(table: pl.DataFrame, scored: pl.DataFrame) -> pl.DataFrame:
    """The rows of `scored` (score_table's per-item frame) for the items of `table`, in its order;
    refuses a table holding an item `scored` lacks."""
    per_item = table.select("item_id").join(scored, on="item_id", how="left", maintain_order="left")
    missing = per_item.filter(pl.col("pred").is_null())["item_id"].to_list()
    if missing:
        raise ValueError(f"{len(missing)} items have no earlier scores (first: {missing[0]!r})")
    return per_item.select(scored.columns)


def known_or_scored(
    scorer: Scorer, table: pl.DataFrame, known: pl.DataFrame | None, layers: list[int] | None = None
) -> pl.DataFrame:
    """The model's per-item scores on `table` (score_table's frame; with `layers`, of the model
    running those layers only): read from `known` (its earlier per-item scores, e.g. a
    baseline's, a student's own answers, a prefix's from gradual pruning) where they hold every
    item of the table, else scored."""
    if known is not None and table["item_id"].is_in(known["item_id"].implode()).all():
        return known_items(table, known)
    return score_table(replace(scorer, progress=False), table, layers=layers)


def encode_table(tok, table: pl.DataFrame) -> list[Encoded]:
    """`encode` of every item (context, choices) of a task table."""
    bos = starts_with_bos(tok)
    return [encode(tok, c, ch, bos) for c, ch in zip(table["context"], table["choices"])]


@dataclass
class Unit:
    """One packed sequence of the batch driver: item `row` of the table with its choices
    `choices` (all of them where the model packs choices, else one)."""

    row: int
    choices: list[int]
    item: PackedItem


def _batches(units: list[Unit], batch_size: int) -> list[list[Unit]]:
    order = sorted(range(len(units)), key=lambda i: len(units[i].item.ids))  # little padding
    return [[units[i] for i in order[j : j + batch_size]] for j in range(0, len(order), batch_size)]


# forward(stack, batch, units) -> {key: stack.readout of the batch}; see score_batches
BatchForward = Callable[[DecoderStack, PackedBatch, list[Unit]], dict]
# layer_masks(batch, rows) -> {layer: additive mask [B, 1 or heads, T, T]}; rows: each batch
# row's item index in the table; see score_table
LayerMasks = Callable[[PackedBatch, list[int]], dict[int, torch.Tensor]]


def score_batches(
    scorer: Scorer,
    table: pl.DataFrame,
    forward: BatchForward,
    desc: str = "scoring",
    grad: bool = False,
) -> dict[object, pl.DataFrame]:
    """The engine's batch driver: encode every item of `table`, pack each (context and all of its
    choices in one sequence where the model's layers allow it, else one sequence per choice),
    batch sequences of similar length, collate, and hand each batch to
    `forward(stack, batch, units)`, which runs the layers and returns {key: stack.readout(...)}.
    Returns {key: per_item_frame}, keys in the order `forward` first gave them. Runs under
    inference_mode, or with autograd on when `grad` (forward then does its own backward)."""
    stack = check_engine(scorer.model)
    units = []
    for row, e in enumerate(encode_table(scorer.tok, table)):
        if stack.packs_choices:
            units.append(Unit(row, list(range(len(e.choices))), pack(e.context, e.choices)))
        else:
            units += [Unit(row, [j], pack(e.context, [c])) for j, c in enumerate(e.choices)]
    scores = _score_units(scorer, stack, units, [len(c) for c in table["choices"]], forward, desc, grad)
    return {key: per_item_frame(table, values) for key, values in scores.items()}


def _score_units(
    scorer: Scorer, stack: DecoderStack, units: list[Unit], n_choices: list[int], forward, desc: str, grad: bool
) -> dict[object, list]:
    """score_batches' loop over packed `units`: {key: per row, (log-prob per choice, greedy flag
    per choice)}; n_choices: each row's number of choices."""
    model, batch_size, progress = scorer.model, scorer.batch_size, scorer.progress
    scores: dict[object, list] = {}
    dtype, device = next(model.parameters()).dtype, device_of(model)
    with (
        torch.enable_grad() if grad else torch.inference_mode(),
        tqdm(total=len(n_choices), desc=desc, disable=not progress, mininterval=2.0, unit="item") as bar,
    ):
        for batch_units in _batches(units, batch_size):
            batch = collate([u.item for u in batch_units], dtype, device)
            for key, readout in forward(stack, batch, batch_units).items():
                per_item = scores.setdefault(key, [([None] * n, [None] * n) for n in n_choices])
                for unit, (totals, greedy) in zip(batch_units, readout):
                    for j, total, flag in zip(unit.choices, totals, greedy):
                        per_item[unit.row][0][j] = total
                        per_item[unit.row][1][j] = flag
            bar.update(sum(1 for u in batch_units if u.choices[-1] == n_choices[u.row] - 1))
    return scores


def shared_prefix(contexts: list[list[int]]) -> int:
    """How many leading tokens `contexts` share, leaving each at least one of its own."""
    first, most = contexts[0], min(len(c) for c in contexts) - 1
    return next((i for i in range(most) if any(c[i] != first[i] for c in contexts)), most)


def score_as_tree(scorer: Scorer, tables: list[pl.DataFrame], desc: str = "scoring") -> list[pl.DataFrame]:
    """score_table of each of `tables`, which ask the same items in the same order with contexts
    that share a prefix (one fact under each rotation of its options): each item's contexts and
    their choices packed as one tree (gna.engine.packing.pack_tree), so the shared prefix runs
    once. Within rounding of scoring each table alone (other batches; tested). A model whose
    layers do not pack choices scores each table alone."""
    stack = check_engine(scorer.model)
    if not stack.packs_choices or len(tables) < 2:
        return [score_table(scorer, t, desc) for t in tables]
    ids = [t["item_id"].to_list() for t in tables]
    if any(other != ids[0] for other in ids[1:]):
        raise ValueError("score_as_tree: the tables do not ask the same items in the same order")
    encoded = [encode_table(scorer.tok, t) for t in tables]
    items = list(zip(*encoded))
    shared = [shared_prefix([e.context for e in contexts]) for contexts in items]
    if 0 in shared:  # an item whose contexts differ from their first token: no tree to share
        return [score_table(scorer, t, desc) for t in tables]
    units, n_choices = [], []
    for row, (contexts, n) in enumerate(zip(items, shared)):
        if len({len(e.choices) for e in contexts}) > 1:
            raise ValueError(f"score_as_tree: the tables give item {ids[0][row]!r} different numbers of choices")
        n_choices.append(sum(len(e.choices) for e in contexts))
        branches = [(e.context[n:], e.choices) for e in contexts]
        units.append(Unit(row, list(range(n_choices[-1])), pack_tree(contexts[0].context[:n], branches)))

    def forward(stack, batch, units):
        run = stack.record(batch, keep=set(), read_only=scorer.read_rows_only)
        return {None: stack.readout(run.final, batch)}

    values = _score_units(scorer, stack, units, n_choices, forward, desc, False)[None]
    frames = []
    for t, table in enumerate(tables):
        own = [slice(t * len(e.choices), (t + 1) * len(e.choices)) for e in encoded[t]]
        frames.append(per_item_frame(table, [(totals[s], greedy[s]) for (totals, greedy), s in zip(values, own)]))
    return frames


def score_table(
    scorer: Scorer,
    table: pl.DataFrame,
    desc: str = "scoring",
    layers: list[int] | None = None,
    depths: list[int] | None = None,
    layer_masks: LayerMasks | None = None,
) -> pl.DataFrame:
    """Score every item of a task table; one row per item (see per_item_frame).

    layers: the decoder layers to run, in order (default: all, i.e. the unmodified model).
    depths: read out after the first k of `layers` for each k, all in one pass; the result then
    has one row per (depth, item) and a `depth` column. Reading out after k layers is exactly
    the model pruned to its first k layers (final norm and head kept).
    layer_masks: per batch, attention masks that replace the packed mask in some layers (e.g.
    per-head G&A masks, gna.phases.masking); the other layers keep the packed mask."""
    model = scorer.model
    layers = list(range(len(decoder_layers(model)))) if layers is None else list(layers)
    wanted = sorted(set(depths)) if depths is not None else [len(layers)]
    if wanted[0] < 0 or wanted[-1] > len(layers):
        raise ValueError(f"depths must lie in 0..{len(layers)}, got {depths}")

    keep = {layers[k] for k in wanted if k < len(layers)}

    def forward(stack, batch, units):
        if layer_masks is not None and not stack.packs_choices:
            raise UnsupportedModel(
                f"{family_of(model)}: per-layer attention masks need a model of attention layers only"
            )
        masks = layer_masks(batch, [u.row for u in units]) if layer_masks is not None else None
        # one pass; depth k reads the state after k layers, the last layer only at the read rows
        run = stack.record(batch, layers, masks, keep, read_only=scorer.read_rows_only)
        return {k: stack.readout(run.after(k), batch) for k in wanted}

    frames = score_batches(scorer, table, forward, desc)
    if depths is None:
        return frames[wanted[0]]
    return pl.concat([frames[k].with_columns(pl.lit(k).alias("depth")) for k in wanted])


@dataclass
class Variant:
    """A model variant that shares the computation before `resume_at` with the base model:
    it takes the hidden state entering layer `resume_at` and runs `run_layers` under `context`."""

    key: object
    resume_at: int
    run_layers: list[int]
    context: object = None  # a callable returning a context manager (e.g. head ablation)
    layer_masks: LayerMasks | None = None  # masks replacing the packed one in some of run_layers (score_table's)


def score_variants(
    scorer: Scorer,
    table: pl.DataFrame,
    layers: list[int],
    variants: list[Variant],
    desc: str = "variants",
    base_key: object = None,
) -> dict:
    """Score many variants with exact prefix reuse: per batch the base model's layers run once
    (up to the last resume point only, where the base model's scores are not asked for), the
    hidden state entering each needed layer is kept, and each variant runs only its own layers
    from there. Returns {variant.key: per-item frame}, plus the base model's own scores
    under `base_key` when one is given (read from the same pass: no extra forward)."""
    resume_points = {v.resume_at for v in variants}
    missing = sorted(resume_points - set(layers))
    if missing:
        raise ValueError(f"cannot resume at layers {missing}: not among the kept layers {layers}")

    # without the base model's own scores, no layer after the last resume point is computed
    until = None if base_key is not None or not resume_points else max(resume_points, key=layers.index)

    def forward(stack, batch, units):
        run = stack.record(batch, layers, keep=resume_points, until=until, read_only=scorer.read_rows_only)
        readouts = {base_key: stack.readout(run.final, batch)} if base_key is not None else {}
        for v in variants:
            masks = None
            if v.layer_masks is not None:
                if not stack.packs_choices:
                    raise UnsupportedModel(
                        f"{family_of(stack.model)}: per-layer attention masks need a model of attention layers only"
                    )
                masks = v.layer_masks(batch, [u.row for u in units])
            with v.context() if v.context else contextlib.nullcontext():
                out = stack.run(run.entering[v.resume_at], run, v.run_layers, batch, masks, scorer.read_rows_only)
            readouts[v.key] = stack.readout(out, batch)
        return readouts

    return score_batches(scorer, table, forward, desc)


def score_removals(
    scorer: Scorer,
    table: pl.DataFrame,
    layers: list[int],
    removals: list[int],
    desc: str = "removals",
) -> pl.DataFrame:
    """Score the model made of `layers` with each layer of `removals` left out in turn.

    Exact prefix reuse: the hidden state entering layer r is the same with or without r, so each
    variant runs only the layers after r. One row per (removed_layer, item)."""
    layers = list(layers)
    missing = [r for r in removals if r not in layers]
    if missing:
        raise ValueError(f"cannot remove layers {missing}: not among the kept layers {layers}")
    variants = [Variant(r, r, layers[layers.index(r) + 1 :]) for r in removals]
    frames = score_variants(scorer, table, layers, variants, desc)
    return pl.concat([frames[r].with_columns(pl.lit(r).alias("removed_layer")) for r in removals])


def score_table_ref(model, tok, table: pl.DataFrame) -> pl.DataFrame:
    """Reference scoring: the model's own forward on context + choice, one choice at a time."""
    return per_item_frame(table, [reference_scores(model, e.context, e.choices) for e in encode_table(tok, table)])


PROPORTIONS = ("acc", "acc_norm", "greedy_exact_match", DEGENERACY_METRIC)


def summarize(per_item: pl.DataFrame, by_group: bool) -> pl.DataFrame:
    """Tidy metrics: (task, group, n, metric, value, ci_low, ci_high). `group` is 'all' unless
    by_group. Proportions carry the Wilson 95% interval (null for mean_logp_target). With a
    `pred_other_context` column (the prediction after the context was swapped for another item's, null
    where not checked), also degeneracy_agreement over the checked items, with their n."""
    metrics = {
        "acc": pl.col("correct").cast(pl.Float64).mean(),
        "acc_norm": pl.col("correct_norm").cast(pl.Float64).mean(),
        "greedy_exact_match": pl.col("greedy_match").cast(pl.Float64).mean(),
        "mean_logp_target": pl.col("logp_target").mean(),
    }
    frame = per_item if by_group else per_item.with_columns(pl.lit("all").alias("group"))
    wide = frame.group_by(["task", "group"]).agg(pl.len().alias("n"), *[v.alias(k) for k, v in metrics.items()])
    long = wide.unpivot(index=["task", "group", "n"], on=list(metrics), variable_name="metric", value_name="value")
    if "pred_other_context" in frame.columns:
        checked = frame.filter(pl.col("pred_other_context").is_not_null())
        agreement = checked.group_by(["task", "group"]).agg(
            pl.len().alias("n"),
            pl.lit(DEGENERACY_METRIC).alias("metric"),
            (pl.col("pred") == pl.col("pred_other_context")).cast(pl.Float64).mean().alias("value"),
        )
        long = pl.concat([long, agreement.select(long.columns)], how="vertical_relaxed")
    low, high = wilson_exprs("value", "n")
    is_proportion = pl.col("metric").is_in(PROPORTIONS)
    long = long.with_columns(
        pl.when(is_proportion).then(low).otherwise(None).alias("ci_low"),
        pl.when(is_proportion).then(high).otherwise(None).alias("ci_high"),
    )
    return long.sort(["task", "group", "metric"])


def summarize_task(per_item: pl.DataFrame) -> pl.DataFrame:
    """The tidy summary of one task's per-item scores: rows per group (KV: dictionary size; facts:
    the relation, or known/unknown for the multiple-choice form) and then 'all' for KV-retrieval
    and the facts, 'all' only for other tasks (MMLU's topics are too many for its n). With context-swapped
    predictions, every
    row carries `degenerate`: the task's overall degeneracy_agreement >= DEGENERATE_AGREEMENT."""
    overall = summarize(per_item, by_group=False)
    summary = overall
    if not per_item.is_empty() and (per_item["task"][0] == "kv_retrieval" or per_item["task"][0].startswith("facts_")):
        summary = pl.concat([summarize(per_item, by_group=True), overall])
    agreement = overall.filter(pl.col("metric") == DEGENERACY_METRIC)["value"]
    if len(agreement) and agreement[0] is not None:
        summary = summary.with_columns(pl.lit(agreement[0] >= DEGENERATE_AGREEMENT).alias("degenerate"))
    return summary


def accuracy_of(items: pl.DataFrame) -> dict:
    """acc, mean log-prob of the target, n and the Wilson 95% interval of acc, of per-item scores."""
    n = len(items)
    correct = int(items["correct"].sum())
    low, high = wilson_interval(correct, n)
    return {
        "acc": correct / n if n else None,
        "mean_logp": float(items["logp_target"].mean()) if n else None,
        "n": n,
        "ci_low": low,
        "ci_high": high,
    }
