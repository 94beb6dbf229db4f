"""The evaluation engine: log-likelihood of each choice after a context.

Fast path (`score_table`):
  * logits only at the scored positions (the vocabulary projection is a large share of FLOPs);
  * items whose choices are all single tokens (MMLU letters) run as right-padded batches and
    read the last real position of each row (causal attention never sees the padding);
  * items with multi-token choices run the shared context once, then all choices together on
    a copy of its KV cache (shared-prefix reuse), instead of one full forward per choice.
Slow reference (`score_table_ref`): one full forward of context+choice per choice. A test
keeps the two equal.

Tokenisation follows lm-eval: context ids = encode(context); choice ids =
encode(context + choice)[len(context ids):], so the model sees context ids + choice ids.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import polars as pl
import torch
from tqdm.auto import tqdm


@dataclass
class Encoded:
    context: list[int]
    choices: list[list[int]]


def encode(tok, context: str, choices: list[str]) -> Encoded:
    # lm-eval moves trailing context whitespace into the continuation
    n_space = len(context) - len(context.rstrip())
    if n_space:
        choices = [context[-n_space:] + c for c in choices]
        context = context[:-n_space]
    ctx = tok(context, add_special_tokens=False)["input_ids"]
    if tok.bos_token_id is not None and getattr(tok, "add_bos_token", False):
        ctx = [tok.bos_token_id] + ctx
    conts = []
    for choice in choices:
        whole = tok(context + choice, add_special_tokens=False)["input_ids"]
        offset = len(ctx) - (1 if ctx and getattr(tok, "add_bos_token", False) else 0)
        cont = whole[offset:]
        if not cont:
            raise ValueError(f"choice {choice!r} encodes to no tokens after context")
        conts.append(cont)
    if not ctx:
        raise ValueError("empty context")
    return Encoded(ctx, conts)


def _head(model, hidden: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(model.get_output_embeddings()(hidden).float(), dim=-1)


def _choice_scores(lp_first: torch.Tensor, conts: list[list[int]], lp_rest: dict[int, torch.Tensor]):
    """Sum log-probs per choice; greedy = every choice token is the argmax at its position."""
    totals, greedy = [], []
    for j, cont in enumerate(conts):
        total = float(lp_first[cont[0]])
        ok = int(lp_first.argmax()) == cont[0]
        if len(cont) > 1:
            rest = lp_rest[j]  # [len(cont)-1, vocab], row i predicts cont[i+1]
            idx = torch.tensor(cont[1:])
            total += float(rest[torch.arange(len(idx)), idx].sum())
            ok = ok and bool((rest.argmax(-1) == idx).all())
        totals.append(total)
        greedy.append(ok)
    return totals, greedy


@torch.inference_mode()
def _score_with_prefix_cache(model, enc: Encoded):
    base = model.base_model
    ids = torch.tensor([enc.context])
    multi = [j for j, c in enumerate(enc.choices) if len(c) > 1]
    out = base(input_ids=ids, use_cache=bool(multi))
    lp_first = _head(model, out.last_hidden_state[0, -1])
    lp_rest: dict[int, torch.Tensor] = {}
    if multi:
        cache = out.past_key_values
        cache.batch_repeat_interleave(len(multi))
        width = max(len(enc.choices[j]) - 1 for j in multi)
        inp = torch.zeros(len(multi), width, dtype=torch.long)
        for r, j in enumerate(multi):
            inp[r, : len(enc.choices[j]) - 1] = torch.tensor(enc.choices[j][:-1])
        pos = torch.arange(len(enc.context), len(enc.context) + width).expand(len(multi), -1)
        hidden = base(input_ids=inp, past_key_values=cache, position_ids=pos, use_cache=True).last_hidden_state
        for r, j in enumerate(multi):
            lp_rest[j] = _head(model, hidden[r, : len(enc.choices[j]) - 1])
    return _choice_scores(lp_first, enc.choices, lp_rest)


@torch.inference_mode()
def _score_single_token_batch(model, encs: list[Encoded]):
    """Right-padded batch; only the last real position of each row is projected to logits."""
    lengths = [len(e.context) for e in encs]
    inp = torch.zeros(len(encs), max(lengths), dtype=torch.long)
    for r, e in enumerate(encs):
        inp[r, : len(e.context)] = torch.tensor(e.context)
    hidden = model.base_model(input_ids=inp, use_cache=False).last_hidden_state
    last = hidden[torch.arange(len(encs)), torch.tensor(lengths) - 1]
    lps = _head(model, last)
    return [_choice_scores(lps[r], e.choices, {}) for r, e in enumerate(encs)]


@torch.inference_mode()
def _score_full_ref(model, enc: Encoded):
    """Reference: one full forward per choice, logits everywhere."""
    totals, greedy = [], []
    for cont in enc.choices:
        ids = torch.tensor([enc.context + cont[:-1]])
        lp = torch.log_softmax(model(input_ids=ids).logits[0].float(), dim=-1)
        rows = lp[len(enc.context) - 1:]
        idx = torch.tensor(cont)
        totals.append(float(rows[torch.arange(len(cont)), idx].sum()))
        greedy.append(bool((rows.argmax(-1) == idx).all()))
    return totals, greedy


def _per_item_frame(table: pl.DataFrame, scores: list, choices_bytes: list[list[int]]) -> pl.DataFrame:
    rows = []
    for row, (totals, greedy), nbytes in zip(table.iter_rows(named=True), scores, choices_bytes):
        target = row["target"]
        pred = max(range(len(totals)), key=totals.__getitem__)
        norm = [t / max(b, 1) for t, b in zip(totals, nbytes)]
        pred_norm = max(range(len(norm)), key=norm.__getitem__)
        rows.append({
            "task": row["task"], "item_id": row["item_id"], "group": row["group"], "target": target,
            "pred": pred, "correct": pred == target, "pred_norm": pred_norm,
            "correct_norm": pred_norm == target, "greedy_match": greedy[target],
            "logp_target": totals[target], "logprobs": totals,
        })
    return pl.DataFrame(rows)


def score_table(model, tok, table: pl.DataFrame, batch_size: int = 8, progress: bool = True,
                desc: str = "scoring") -> pl.DataFrame:
    """Score every item of a task table; one row per item (see _per_item_frame)."""
    encs = [encode(tok, c, ch) for c, ch in zip(table["context"], table["choices"])]
    scores: list = [None] * len(encs)
    single = [i for i, e in enumerate(encs) if all(len(c) == 1 for c in e.choices)]
    multi = [i for i, e in enumerate(encs) if i not in set(single)]
    single.sort(key=lambda i: len(encs[i].context))  # similar lengths waste less padding
    bar = tqdm(total=len(encs), desc=desc, disable=not progress, mininterval=2.0)
    for start in range(0, len(single), batch_size):
        chunk = single[start: start + batch_size]
        for i, s in zip(chunk, _score_single_token_batch(model, [encs[i] for i in chunk])):
            scores[i] = s
        bar.update(len(chunk))
    for i in multi:
        scores[i] = _score_with_prefix_cache(model, encs[i])
        bar.update(1)
    bar.close()
    nbytes = [[len(c.encode()) for c in ch] for ch in table["choices"]]
    return _per_item_frame(table, scores, nbytes)


def score_table_ref(model, tok, table: pl.DataFrame) -> pl.DataFrame:
    encs = [encode(tok, c, ch) for c, ch in zip(table["context"], table["choices"])]
    scores = [_score_full_ref(model, e) for e in encs]
    nbytes = [[len(c.encode()) for c in ch] for ch in table["choices"]]
    return _per_item_frame(table, scores, nbytes)


def summarize(per_item: pl.DataFrame, by_group: bool) -> pl.DataFrame:
    """Tidy metrics: (task, group, n, metric, value). `group` is 'all' unless by_group."""
    metrics = {
        "acc": pl.col("correct").cast(pl.Float64).mean(),
        "acc_norm": pl.col("correct_norm").cast(pl.Float64).mean(),
        "greedy_exact_match": pl.col("greedy_match").cast(pl.Float64).mean(),
        "mean_logp_target": pl.col("logp_target").mean(),
    }
    frame = per_item if by_group else per_item.with_columns(pl.lit("all").alias("group"))
    wide = frame.group_by(["task", "group"]).agg(pl.len().alias("n"), *[v.alias(k) for k, v in metrics.items()])
    long = wide.unpivot(index=["task", "group", "n"], on=list(metrics), variable_name="metric", value_name="value")
    return long.sort(["task", "group", "metric"])


def chance_accuracy(table: pl.DataFrame) -> float:
    return float(sum(1 / len(c) for c in table["choices"]) / max(len(table), 1))


class Timer:
    def __enter__(self):
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.seconds = time.perf_counter() - self.start


def isclose(a: float, b: float, tol: float = 1e-4) -> bool:
    return math.isclose(a, b, rel_tol=tol, abs_tol=tol)
