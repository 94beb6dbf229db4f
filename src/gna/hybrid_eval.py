"""Scoring students: task accuracy per variant, held-out perplexity, and inference memory."""

from __future__ import annotations

import polars as pl
import torch

from gna.hybrid import cache_nbytes, inference_memory, prefill
from gna.scoring import score_table, summarize


def score_model(model, tok, tables: dict[str, pl.DataFrame], heldout: torch.Tensor | None, batch_size: int,
                progress: bool = True) -> pl.DataFrame:
    """Tidy (task, group, n, metric, value) for every task table, plus held-out perplexity."""
    from gna.distill import perplexity

    frames = []
    for name, table in tables.items():
        per_item = score_table(model, tok, table, batch_size=batch_size, progress=progress, desc=name)
        by_group = name == "kv_retrieval"
        frames.append(pl.concat([summarize(per_item, by_group=True), summarize(per_item, by_group=False)])
                      if by_group else summarize(per_item, by_group=False))
    if heldout is not None:
        frames.append(pl.DataFrame({"task": ["heldout"], "group": ["all"], "n": [heldout.numel()],
                                    "metric": ["perplexity"], "value": [perplexity(model, heldout)]}))
    return pl.concat(frames, how="vertical_relaxed")


def memory_rows(name: str, cfg, kept: list | None, state_size: int, seq_lens: list[int], bytes_per_value: int) -> list[dict]:
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    rows = []
    for length in seq_lens:
        mem = inference_memory(cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads, head_dim,
                               kept, state_size, length, bytes_per_value)
        rows.append({"variant": name, "heads_kept": None if kept is None else len(kept),
                     "state_size": None if kept is None else state_size, "seq_len": length, **mem})
    return rows


def measured_cache(model, length: int, seed: int = 0) -> int:
    """Bytes actually held by a student's recurrent cache after a prefill of `length` tokens."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, model.config.vocab_size, (1, length), generator=gen)
    _, caches = prefill(model, ids)
    return cache_nbytes(caches)
