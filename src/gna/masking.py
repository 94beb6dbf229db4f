"""Per-sample Gather-and-Aggregate masking (attention heads).

For one Gather head and one Aggregate head, three conditions are scored:
  (a) the unmodified model;
  (b) both heads ablated (their outputs zeroed);
  (c) both heads restricted to their G&A pattern, per sample: the Gather head's query rows
      inside a segment (its tokens and its summary token) see only that segment; the Aggregate
      head's answer rows (the last context token and the choice tokens) see only the segments;
      every other row of these two heads sees only itself.
If (c) stays near (a) while (b) falls, the G&A pattern alone carries the retrieval.
Masks are per head ([batch, heads, T, T]) on the packed sequences of gna.packing; every other
head keeps the ordinary mask. `restrict=False` builds the same per-head masks without any
restriction — a test checks that it reproduces the unmasked logits.
"""

from __future__ import annotations

import polars as pl
import torch

from gna.gather_aggregate import Segments
from gna.heads import ablate_heads
from gna.packing import PackedBatch, collate, pack
from gna.scoring import _batches, _encode_table, _frame
from gna.stack import DecoderStack


def head_mask(batch: PackedBatch, segs: list[Segments], n_heads: int, head: int, role: str,
              restrict: bool = True) -> torch.Tensor:
    """[B, n_heads, T, T] additive mask: the ordinary packed mask, with `head` restricted to its role."""
    mask = batch.mask.expand(-1, n_heads, -1, -1).clone()
    if not restrict:
        return mask
    blocked = torch.finfo(mask.dtype).min
    T = mask.shape[-1]
    for b, (item, seg) in enumerate(zip(batch.items, segs)):
        allowed = torch.eye(T, dtype=torch.bool)
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


def _score_with_layer_masks(model, tok, table: pl.DataFrame, masks_for, batch_size: int = 8,
                            segment_fn=None) -> pl.DataFrame:
    """Score `table` through the layer loop with per-layer masks: masks_for(batch, segs) returns
    {layer: [B, H, T, T] additive mask}; other layers keep the ordinary packed mask."""
    stack = DecoderStack(model)
    encs = _encode_table(tok, table)
    packed = [pack(e.context, e.choices) for e in encs]
    rows = list(table.iter_rows(named=True))
    scores = [None] * len(packed)
    dtype = next(model.parameters()).dtype
    with torch.inference_mode():
        for chunk in _batches(packed, batch_size):
            batch = collate([packed[i] for i in chunk], dtype)
            segs = None
            if segment_fn is not None:
                segs = [segment_fn(tok, rows[i]) for i in chunk]
                for i, seg in zip(chunk, segs):
                    if len(seg.tokens) != len(encs[i].context):
                        raise ValueError(f"item {i}: segments were found on {len(seg.tokens)} tokens but the "
                                         f"context has {len(encs[i].context)} (a BOS token or trailing space?)")
            masks = masks_for(batch, segs)
            h, rope = stack.embed(batch)
            for i, layer in enumerate(stack.layers):
                h = layer(h, attention_mask=masks.get(i, batch.mask), position_ids=batch.positions,
                          position_embeddings=rope)
            for i, s in zip(chunk, stack.readout(h, batch)):
                scores[i] = s
    return _frame(table, scores)


def score_masked(model, tok, table: pl.DataFrame, segment_fn, heads: dict[str, tuple[int, int]],
                 restrict: bool = True, batch_size: int = 8) -> pl.DataFrame:
    """Score `table` with the heads {'gather': (layer, head), 'aggregate': (layer, head)} restricted."""
    n_heads = model.config.num_attention_heads

    def masks_for(batch, segs):
        masks: dict[int, torch.Tensor] = {}
        for role, (layer, head) in heads.items():
            base = masks.get(layer)
            m = head_mask(batch, segs, n_heads, head, role, restrict)
            masks[layer] = m if base is None else torch.minimum(base, m)  # both restrictions
        return masks

    return _score_with_layer_masks(model, tok, table, masks_for, batch_size, segment_fn)


def answer_rows_mask(batch: PackedBatch, n_heads: int, heads: list[int]) -> torch.Tensor:
    """[B, n_heads, T, T]: the ordinary packed mask, except that the answer rows of `heads` (the
    last context token and every choice token) see only themselves — nothing is aggregated there."""
    mask = batch.mask.expand(-1, n_heads, -1, -1).clone()
    blocked = torch.finfo(mask.dtype).min
    T = mask.shape[-1]
    eye = torch.eye(T, dtype=torch.bool)
    for b, item in enumerate(batch.items):
        rows = [item.score_at[0][0]] + [p for p, s in enumerate(item.segment) if s >= 0]
        for h in heads:
            mask[b, h, rows] = torch.where(eye[rows], 0.0, blocked).to(mask.dtype)
    return mask


def answer_rows_experiment(model, tables: dict[str, pl.DataFrame], tok, batch_size: int = 8) -> pl.DataFrame:
    """Hybrid students: every attention head's answer rows masked (SSM heads untouched), against
    the unmodified student, on each task (the study's Zamba2 table)."""
    from gna.hybrid import mixers
    from gna.scoring import score_table

    n_heads = model.config.num_attention_heads
    attention = {m.layer_idx: m.attention_heads for m in mixers(model) if m.attention_heads}
    if not attention:
        raise ValueError("the model has no attention heads to mask (a pure SSM)")

    def masks_for(batch, segs):
        return {layer: answer_rows_mask(batch, n_heads, heads) for layer, heads in attention.items()}

    rows = []
    for task, table in tables.items():
        for condition, frame in (("unmodified", score_table(model, tok, table, batch_size=batch_size, progress=False)),
                                 ("attention answer rows masked",
                                  _score_with_layer_masks(model, tok, table, masks_for, batch_size))):
            rows.append({"task": task, "condition": condition, "acc": float(frame["correct"].mean()),
                         "mean_logp": float(frame["logp_target"].mean()), "n": len(frame),
                         "attention_heads": sum(len(h) for h in attention.values())})
    return pl.DataFrame(rows)


def masking_experiment(model, tok, table: pl.DataFrame, segment_fn, heads: dict[str, tuple[int, int]],
                       batch_size: int = 8, knowledge: pl.DataFrame | None = None) -> pl.DataFrame:
    """acc and mean log-prob of the target under (a) unmodified, (b) ablated, (c) G&A-only, on the
    retrieval `table`; on `knowledge` (e.g. MMLU cloze, which has no segments) (a) and (b) only."""
    from gna.scoring import score_table

    results = {"(a) unmodified": score_table(model, tok, table, batch_size=batch_size, progress=False)}
    with ablate_heads(model, list(heads.values())):
        results["(b) G&A heads ablated"] = score_table(model, tok, table, batch_size=batch_size, progress=False)
    results["(c) G&A pattern only"] = score_masked(model, tok, table, segment_fn, heads, True, batch_size)
    label = ", ".join(f"{role} L{l}H{h}" for role, (l, h) in heads.items())
    task = table["task"][0]
    rows = [{"condition": name, "heads": label, "task": task, "acc": float(f["correct"].mean()),
             "mean_logp": float(f["logp_target"].mean()), "n": len(f)} for name, f in results.items()]
    if knowledge is not None and len(knowledge):
        plain = score_table(model, tok, knowledge, batch_size=batch_size, progress=False)
        with ablate_heads(model, list(heads.values())):
            ablated = score_table(model, tok, knowledge, batch_size=batch_size, progress=False)
        for name, f in (("(a) unmodified", plain), ("(b) G&A heads ablated", ablated)):
            rows.append({"condition": name, "heads": label, "task": knowledge["task"][0],
                         "acc": float(f["correct"].mean()), "mean_logp": float(f["logp_target"].mean()), "n": len(f)})
    return pl.DataFrame(rows)
