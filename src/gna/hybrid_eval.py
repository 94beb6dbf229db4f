"""Inference memory of students: the formula per variant and a measured check."""

from __future__ import annotations

import torch

from gna.hybrid import cache_nbytes, inference_memory, prefill


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
