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


def score_masked(model, tok, table: pl.DataFrame, segment_fn, heads: dict[str, tuple[int, int]],
                 restrict: bool = True, batch_size: int = 8) -> pl.DataFrame:
    """Score `table` with the heads {'gather': (layer, head), 'aggregate': (layer, head)} restricted."""
    stack = DecoderStack(model)
    n_heads = model.config.num_attention_heads
    encs = _encode_table(tok, table)
    packed = [pack(e.context, e.choices) for e in encs]
    rows = list(table.iter_rows(named=True))
    scores = [None] * len(packed)
    dtype = next(model.parameters()).dtype
    with torch.inference_mode():
        for chunk in _batches(packed, batch_size):
            batch = collate([packed[i] for i in chunk], dtype)
            segs = [segment_fn(tok, rows[i]) for i in chunk]
            for i, seg in zip(chunk, segs):
                if len(seg.tokens) != len(encs[i].context):
                    raise ValueError(f"item {i}: segments were found on {len(seg.tokens)} tokens but the context "
                                     f"has {len(encs[i].context)} (a BOS token or trailing space?)")
            masks: dict[int, torch.Tensor] = {}
            for role, (layer, head) in heads.items():
                base = masks.get(layer)
                m = head_mask(batch, segs, n_heads, head, role, restrict)
                masks[layer] = m if base is None else torch.minimum(base, m)  # both restrictions
            h, rope = stack.embed(batch)
            for i, layer in enumerate(stack.layers):
                h = layer(h, attention_mask=masks.get(i, batch.mask), position_ids=batch.positions,
                          position_embeddings=rope)
            for i, s in zip(chunk, stack.readout(h, batch)):
                scores[i] = s
    return _frame(table, scores)


def masking_experiment(model, tok, table: pl.DataFrame, segment_fn, heads: dict[str, tuple[int, int]],
                       batch_size: int = 8) -> pl.DataFrame:
    """acc and mean log-prob of the target under (a) unmodified, (b) ablated, (c) G&A-only."""
    from gna.scoring import score_table

    results = {"(a) unmodified": score_table(model, tok, table, batch_size=batch_size, progress=False)}
    with ablate_heads(model, list(heads.values())):
        results["(b) G&A heads ablated"] = score_table(model, tok, table, batch_size=batch_size, progress=False)
    results["(c) G&A pattern only"] = score_masked(model, tok, table, segment_fn, heads, True, batch_size)
    label = ", ".join(f"{role} L{l}H{h}" for role, (l, h) in heads.items())
    return pl.DataFrame([{"condition": name, "heads": label, "acc": float(f["correct"].mean()),
                          "mean_logp": float(f["logp_target"].mean()), "n": len(f)} for name, f in results.items()])
