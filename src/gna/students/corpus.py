"""The distillation corpus (offline default): MMLU questions outside the evaluation subset, with
their answers, and synthetic KV-retrieval prompts with their answers, from seeds the evaluation
never uses, joined into token windows; held-out windows (other questions, other seeds) measure
perplexity."""

from __future__ import annotations

import math
import random

import polars as pl
import torch

from gna.tasks.tables import build_kv_retrieval, build_mmlu


def answered_mmlu(pool: pl.DataFrame, seed: int) -> list[str]:
    """Each MMLU question of `pool` in letter format followed by its answer letter."""
    if not len(pool):
        return []
    return [row["context"] + row["choices"][row["target"]]
            for row in build_mmlu(pool, pool, "letter", 0, seed).iter_rows(named=True)]


def answered_kv(sizes: list[int], n: int, seed: int, template: str) -> list[str]:
    """At least `n` KV-retrieval prompts (spread over dictionary `sizes`) followed by their answer."""
    per_size = max(1, math.ceil(n / len(sizes)))
    return [row["context"] + row["choices"][row["target"]]
            for row in build_kv_retrieval(sizes, per_size, seed, template).iter_rows(named=True)]


def token_windows(tok, mmlu_docs: list[str], kv_docs: list[str], kv_share: float, seq_len: int, n_windows: int,
                  seed: int) -> torch.Tensor:
    """Documents drawn at random (KV with probability kv_share), joined by EOS and cut into
    `n_windows` windows of `seq_len` tokens: [n_windows, seq_len]."""
    sep = tok.eos_token_id if tok.eos_token_id is not None else 0
    rng = random.Random(f"corpus-{seed}")
    mmlu_docs, kv_docs = list(mmlu_docs), list(kv_docs)
    rng.shuffle(mmlu_docs)
    rng.shuffle(kv_docs)
    need = seq_len * n_windows
    stream: list[int] = []
    while len(stream) < need and (mmlu_docs or kv_docs):
        use_kv = kv_docs and (not mmlu_docs or rng.random() < kv_share)
        doc = (kv_docs if use_kv else mmlu_docs).pop()
        stream += tok(doc, add_special_tokens=False)["input_ids"] + [sep]
    if len(stream) < need:
        raise ValueError(f"distillation corpus too small: {len(stream)} tokens, {need} needed for {n_windows} "
                         f"windows of {seq_len} (lower hybrid.corpus.train_windows / heldout_windows / seq_len)")
    return torch.tensor(stream[:need]).view(n_windows, seq_len)


def split_pool(pool: pl.DataFrame, heldout_share: float) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(train, held-out) questions: the first `heldout_share` of the pool is held out."""
    n_held = int(round(len(pool) * heldout_share))
    return pool[n_held:], pool[:n_held]


def build_corpus(tok, mmlu_pool: pl.DataFrame, corpus: dict, template: str, seed: int) -> dict:
    """Train and held-out windows {"train": [n, T], "heldout": [m, T]} (disjoint questions and
    KV seeds; the MMLU evaluation subset is never in `mmlu_pool`)."""
    train_pool, held_pool = split_pool(mmlu_pool, corpus["heldout_share"])
    out = {}
    for split, pool, n, split_seed in (("train", train_pool, corpus["train_windows"], seed),
                                       ("heldout", held_pool, corpus["heldout_windows"], seed + 1)):
        n_kv = corpus["seq_len"] * n // 16 if corpus["kv_share"] > 0 else 0  # more than enough documents
        kv_docs = answered_kv(corpus["kv_sizes"], n_kv, split_seed, template) if n_kv else []
        out[split] = token_windows(tok, answered_mmlu(pool, split_seed), kv_docs, corpus["kv_share"],
                                   corpus["seq_len"], n, split_seed)
    return out
