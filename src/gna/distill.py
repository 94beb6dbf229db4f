"""Retrieval-guided distillation of a transformer into SSM / hybrid students (MOHAWK-style).

Stages, each a workflow rule so Snakemake caches it:
  teacher   the distillation corpus (token windows), the teacher's hidden state entering every
            layer and its top-k next-token log-probs — computed once, shared by every student
  align     layer-local alignment, once per state size: given the teacher's hidden state h_i,
            every SSM head of layer i is fitted to reproduce its attention head's contribution
            to h_{i+1} (the head output seen through o_proj). Heads are fitted independently, so
            one alignment serves every heads-kept variant with that state size; the kept
            heads and the MLPs are the teacher's own, so a perfect fit reproduces h_{i+1}.
  kd        end-to-end knowledge distillation of one variant (kept heads from the ranking,
            SSM heads from `align`) on the teacher's next-token distributions.
Only SSM parameters are trained; every teacher weight stays frozen.

Corpus (offline default): MMLU questions outside the evaluation subset, with their answers,
and synthetic KV-retrieval prompts with their answers, from seeds the evaluation never uses;
held-out windows (other questions, other seeds) measure perplexity.
"""

from __future__ import annotations

import copy
import math
import random

import polars as pl
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from gna.hybrid import HybridMixer, make_hybrid, mixers
from gna.tasks import build_kv_retrieval, build_mmlu

SSM_KEYS = ("C_proj.weight", "B_proj.weight", "x_proj.weight", "decay_proj.weight", "decay_proj.bias", "D",
            "C_proj.bias", "B_proj.bias", "x_proj.bias")


# -- corpus -----------------------------------------------------------------------------------

def answered_mmlu(pool: pl.DataFrame, seed: int) -> list[str]:
    if not len(pool):
        return []
    return [row["context"] + row["choices"][row["target"]]
            for row in build_mmlu(pool, pool, "letter", 0, seed).iter_rows(named=True)]


def answered_kv(sizes: list[int], n: int, seed: int, template: str) -> list[str]:
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
    n_held = int(round(len(pool) * heldout_share))
    return pool[n_held:], pool[:n_held]


# -- teacher ----------------------------------------------------------------------------------

@torch.inference_mode()
def teacher_activations(model, ids: torch.Tensor, top_k: int, batch: int = 4, progress: bool = True) -> dict:
    """Hidden state entering each layer (float16, [layers, n, T, d]) and the teacher's top-k
    next-token log-probs at every position."""
    layers = model.base_model.layers
    captured: list[torch.Tensor] = []

    def grab(module, args, kwargs):
        captured.append((args[0] if args else kwargs["hidden_states"]).to(torch.float16))

    hooks = [layer.register_forward_pre_hook(grab, with_kwargs=True) for layer in layers]
    hidden, top_lp, top_ix = [], [], []
    try:
        for start in tqdm(range(0, len(ids), batch), desc="teacher activations", disable=not progress):
            captured.clear()
            logits = model(input_ids=ids[start: start + batch], use_cache=False).logits.float()
            hidden.append(torch.stack(captured))
            lp, ix = torch.log_softmax(logits, -1).topk(top_k, dim=-1)
            top_lp.append(lp)
            top_ix.append(ix.to(torch.int32))
    finally:
        for h in hooks:
            h.remove()
    return {"hidden": torch.cat(hidden, dim=1).contiguous(), "top_logp": torch.cat(top_lp), "top_idx": torch.cat(top_ix)}


# -- stage 1: layer-local alignment -----------------------------------------------------------

def _schedule(step: int, steps: int, warmup: int) -> float:
    if step < warmup:
        return (step + 1) / warmup
    return 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup)))


def _output_metric(mixer: HybridMixer) -> torch.Tensor:
    """Per head a P×P factor L with ||L^T y||² = ||W_o,h y||²: errors are measured as the head's
    contribution to the residual stream, not in its own (arbitrarily scaled) coordinates."""
    p = mixer.head_dim
    w = mixer.o_proj.weight.detach().float()
    eye = torch.eye(p)
    blocks = []
    for h in range(mixer.num_heads):
        wh = w[:, h * p: (h + 1) * p]
        gram = wh.T @ wh
        blocks.append(torch.linalg.cholesky(gram + 1e-6 * gram.diagonal().mean() * eye))
    return torch.stack(blocks)  # [H, P, P]


def align_layers(model, hidden: torch.Tensor, state_size: int, steps: int, batch: int, lr: float, seed: int,
                 progress: bool = True, log_every: int = 10) -> tuple[dict, pl.DataFrame]:
    """Fit one SSM head per attention head of every layer (the pure-SSM student, k = 0).

    hidden: [layers, n, T, d] teacher hidden states entering each layer. Returns the SSM
    parameters {"<layer>.<param>": tensor} and the loss curve (relative error per layer)."""
    torch.manual_seed(seed)
    student = make_hybrid(copy.deepcopy(model), [], state_size)
    for p in student.parameters():
        p.requires_grad_(False)
    ms = mixers(student)
    params = [p for m in ms for p in m.ssm_params()]
    for p in params:
        p.requires_grad_(True)
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    metrics = [_output_metric(m) for m in ms]
    base = student.base_model
    n_layers, n_seq, length, _ = hidden.shape
    pos = torch.arange(length)[None]
    rng = torch.Generator().manual_seed(seed)
    _init_head_scales(ms, base, hidden, pos)
    curve = []
    warmup = max(1, steps // 10)
    with tqdm(range(steps), desc=f"align n={state_size}", disable=not progress, mininterval=2.0) as bar:
        for step in bar:
            for g in opt.param_groups:
                g["lr"] = lr * _schedule(step, steps, warmup)
            pick = torch.randperm(n_seq, generator=rng)[:batch]
            opt.zero_grad(set_to_none=True)
            per_layer = []
            for i, (layer, m, metric) in enumerate(zip(base.layers, ms, metrics)):
                h = hidden[i, pick].float()
                u = layer.input_layernorm(h)
                rope = base.rotary_emb(u, position_ids=pos.expand(len(pick), -1))
                with torch.no_grad():
                    target = torch.einsum("blhp,hpq->blhq", m.attention_output(u, rope, None, list(range(m.num_heads))),
                                          metric)
                pred = torch.einsum("blhp,hpq->blhq", m.ssm_output(u, None), metric)
                loss = (pred - target).square().sum() / target.square().sum().clamp_min(1e-12)
                loss.backward()  # per layer: the layers are independent, keep one graph at a time
                per_layer.append(float(loss))
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            mean = sum(per_layer) / len(per_layer)
            bar.set_postfix(rel_err=f"{mean:.3f}")
            if step % log_every == 0 or step == steps - 1:
                curve += [{"stage": "align", "step": step, "layer": i, "loss": v} for i, v in enumerate(per_layer)]
    state = {f"{m.layer_idx}.{k}": v.detach().clone() for m in ms for k, v in _ssm_state(m).items()}
    return state, pl.DataFrame(curve)


@torch.no_grad()
def _init_head_scales(ms, base, hidden, pos, n_seq: int = 4):
    """Start each SSM head's output norm at the RMS of its teacher head's output."""
    for i, (layer, m) in enumerate(zip(base.layers, ms)):
        u = layer.input_layernorm(hidden[i, :n_seq].float())
        rope = base.rotary_emb(u, position_ids=pos.expand(len(u), -1))
        target = m.attention_output(u, rope, None, m.ssm_heads)
        m.norm_weight.copy_(target.square().mean(dim=(0, 1, 3)).sqrt()[:, None].expand_as(m.norm_weight))


def _ssm_state(m: HybridMixer) -> dict:
    named = {"C_proj.weight": m.C_proj.weight, "B_proj.weight": m.B_proj.weight, "x_proj.weight": m.x_proj.weight,
             "decay_proj.weight": m.decay_proj.weight, "decay_proj.bias": m.decay_proj.bias, "D": m.D,
             "norm_weight": m.norm_weight}
    for key in ("C_proj", "B_proj", "x_proj"):
        bias = getattr(m, key).bias
        if bias is not None:
            named[f"{key}.bias"] = bias
    return named


@torch.no_grad()
def load_aligned(model, aligned: dict):
    """Copy aligned SSM heads (fitted for every head) into a hybrid's SSM heads."""
    for m in mixers(model):
        n, p = m.state_size, m.head_dim
        for key, param in _ssm_state(m).items():
            full = aligned[f"{m.layer_idx}.{key}"]
            rows = {"C_proj": n, "B_proj": n, "x_proj": p}.get(key.split(".")[0], 1)
            if key == "norm_weight":
                full = full.reshape(-1, p)
            if full.shape[0] != m.num_heads * rows:
                raise ValueError(f"aligned state for layer {m.layer_idx} {key}: shape {tuple(full.shape)} does "
                                 f"not fit {m.num_heads} heads with state size {n}")
            idx = torch.cat([torch.arange(h * rows, (h + 1) * rows) for h in m.ssm_heads]) if m.ssm_heads else \
                torch.zeros(0, dtype=torch.long)
            param.copy_(full[idx])
    return model


# -- stage 2: end-to-end knowledge distillation --------------------------------------------------

def distill_logits(student, ids: torch.Tensor, top_logp: torch.Tensor, top_idx: torch.Tensor, steps: int,
                   batch: int, lr: float, seed: int, progress: bool = True, desc: str = "kd") -> pl.DataFrame:
    """Train the student's SSM parameters to match the teacher's top-k next-token
    distribution at every position (cross-entropy to the renormalised teacher top-k)."""
    torch.manual_seed(seed)
    for p in student.parameters():
        p.requires_grad_(False)
    params = [p for m in mixers(student) for p in m.ssm_params() if p.numel()]
    for p in params:
        p.requires_grad_(True)
    curve = []
    if not params or not steps:
        return pl.DataFrame(curve, schema={"stage": pl.String, "step": pl.Int64, "loss": pl.Float64})
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    rng = torch.Generator().manual_seed(seed)
    target = torch.softmax(top_logp.float(), dim=-1)
    warmup = max(1, steps // 10)
    student.train()
    try:
        with tqdm(range(steps), desc=desc, disable=not progress, mininterval=2.0) as bar:
            for step in bar:
                for g in opt.param_groups:
                    g["lr"] = lr * _schedule(step, steps, warmup)
                pick = torch.randperm(len(ids), generator=rng)[:batch]
                logp = torch.log_softmax(student(input_ids=ids[pick], use_cache=False).logits.float(), dim=-1)
                loss = -(target[pick] * logp.gather(-1, top_idx[pick].long())).sum(-1).mean()
                opt.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(params, 1.0)
                opt.step()
                bar.set_postfix(loss=f"{float(loss):.3f}")
                curve.append({"stage": "kd", "step": step, "loss": float(loss)})
    finally:
        student.eval()
        for p in params:
            p.requires_grad_(False)
    return pl.DataFrame(curve)


def variant_name(heads_kept: int, state_size: int) -> str:
    return f"k{heads_kept}-n{state_size}"


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
