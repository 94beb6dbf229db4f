"""Retrieval-guided distillation of a transformer into SSM / hybrid students (MOHAWK-style).

Stages, each a workflow rule so Snakemake caches it:
  teacher   the distillation corpus (gna.students.corpus: token windows), the teacher's hidden state
            entering every layer and its top-k next-token log-probs — computed once, shared by
            every student (run_distill_teacher)
  align     layer-local alignment, once per state size: given the teacher's hidden state h_i,
            every SSM head of layer i is fitted to reproduce its attention head's contribution
            to h_{i+1} (the head output seen through o_proj). Heads are fitted independently, so
            one alignment serves every heads-kept variant with that state size; the kept
            heads and the MLPs are the teacher's own, so a perfect fit reproduces h_{i+1}
            (run_distill_align).
  realign   per variant, before kd: every layer's SSM heads fitted again, first layer first, on the
            stream the student itself produces entering that layer (realign_in_context): the
            student never sees the teacher's stream past its first replaced head.
  kd        end-to-end knowledge distillation of one variant (kept heads from the ranking,
            SSM heads from `align`) on the teacher's next-token distributions (run_distill_kd).
Only SSM parameters (HybridMixer.ssm_state) are trained; every teacher weight stays frozen.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl
import torch
from tqdm.auto import tqdm

from gna.core import work
from gna.core.io import atomic_dir, read_parquet, write_parquet
from gna.core.settings import Evaluation, Files
from gna.core.tensor_files import read_tensors, write_tensors
from gna.engine.device import device_of
from gna.engine.precision import COMPUTE_DTYPES, frozen_weights_in
from gna.engine.stack import UnsupportedModel
from gna.models.families import check_student_family, skip_hint
from gna.models.prepare import load_model
from gna.students.corpus import build_corpus
from gna.students.mixer import HybridMixer, layer_forward, layers_of, mixer_input, mixers, rotary
from gna.students.spec import hybrid_spec, make_hybrid, parse_variant, ranked_heads, save_student
from gna.tasks.tables import load_mmlu_jsonl, select_mmlu

log = logging.getLogger("gna.students.distill")


# -- teacher ----------------------------------------------------------------------------------


FLOAT16_MAX = torch.finfo(torch.float16).max


def compact(t: torch.Tensor) -> torch.Tensor:
    """`t` in float16 where every value fits in it, else in float32: stored states take half the
    space, but some teachers' residual streams outgrow float16 (Gemma 3's reach 1e5, past 65504,
    which would become inf and the alignment NaN)."""
    return t.to(torch.float16) if bool((t.abs() <= FLOAT16_MAX).all()) else t.float()


@torch.inference_mode()
def teacher_activations(
    model, ids: torch.Tensor, top_k: int, hidden_windows: int | None = None, batch: int = 4, progress: bool = True
) -> dict:
    """The teacher's top-k next-token log-probs at every position of the windows `ids` [n, T],
    and the hidden state entering each layer ([layers, hidden_windows, T, d], `compact`) of the
    first `hidden_windows` windows (None: all) — what layer alignment needs, while end-to-end
    distillation needs only the log-probs, so it can use many more windows at little cost."""
    layers = layers_of(model)
    n_hidden = len(ids) if hidden_windows is None else min(hidden_windows, len(ids))
    captured: list[torch.Tensor] = []

    def grab(module, args, kwargs):
        captured.append(args[0] if args else kwargs["hidden_states"])

    hooks = [layer.register_forward_pre_hook(grab, with_kwargs=True) for layer in layers]
    hidden, top_lp, top_ix = [], [], []
    try:
        for start in tqdm(range(0, len(ids), batch), desc="teacher activations", disable=not progress):
            captured.clear()
            logits = model(input_ids=ids[start : start + batch], use_cache=False).logits.float()
            work.add(ids[start : start + batch].numel(), len(layers))
            if start < n_hidden:
                hidden.append(compact(torch.stack(captured)[:, : n_hidden - start].float()))
            lp, ix = torch.log_softmax(logits, -1).topk(top_k, dim=-1)
            top_lp.append(lp)
            top_ix.append(ix.to(torch.int32))
    finally:
        for h in hooks:
            h.remove()
    return {
        "hidden": torch.cat(hidden, dim=1).contiguous(),  # float32 where any batch needed it
        "top_logp": torch.cat(top_lp),
        "top_idx": torch.cat(top_ix),
    }


def run_distill_teacher(
    inputs: Files,
    out_path: str,
    corpus: dict,
    top_k: int,
    seed: int,
    mmlu: dict,
    template: str,
    evaluation: Evaluation = Evaluation(),
) -> None:
    """Build the corpus (gna.students.corpus.build_corpus, from the MMLU questions of inputs.mmlu
    outside the evaluation subset `mmlu` {n, seed, topics}) and write the teacher file `out_path`
    of the model inputs.model (its folder): teacher_activations
    on the train windows (hidden of the first corpus["align_windows"], top_logp, top_idx) plus
    the windows (train_ids, train_answers, heldout_ids). `evaluation.compute_dtype`: the teacher's linear
    layers computed in it, as in every evaluation (gna.engine.precision.linears_computed_in)."""
    model, tok = load_model(inputs.model, evaluation.dtype, compute_dtype=evaluation.compute_dtype)
    try:
        check_student_family(model)
    except UnsupportedModel as err:
        raise UnsupportedModel(f"{err}; {skip_hint(Path(inputs.model).name, 'hybrid')}") from None
    _, pool = select_mmlu(load_mmlu_jsonl(inputs.mmlu), mmlu["n"], mmlu["seed"], mmlu["topics"])
    windows = build_corpus(tok, pool, corpus, template, seed)
    log.info(
        "corpus: %d train windows (%d answer positions; the first %d also for alignment) and %d held-out "
        "windows of %d tokens (%d MMLU questions outside the evaluation subset)",
        len(windows["train"]),
        int(windows["train_answers"].sum()),
        min(corpus["align_windows"], len(windows["train"])),
        len(windows["heldout"]),
        corpus["seq_len"],
        len(pool),
    )
    acts = teacher_activations(model, windows["train"].to(device_of(model)), top_k, corpus["align_windows"])
    write_tensors(
        {
            **acts,
            "train_ids": windows["train"],
            "train_answers": windows["train_answers"],
            "heldout_ids": windows["heldout"],
        },
        out_path,
    )
    log.info("teacher hidden states %s (%s)", tuple(acts["hidden"].shape), acts["hidden"].dtype)


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
    eye = torch.eye(p, device=w.device)
    blocks = []
    for h in range(mixer.num_heads):
        wh = w[:, h * p : (h + 1) * p]
        gram = wh.T @ wh
        blocks.append(torch.linalg.cholesky(gram + 1e-6 * gram.diagonal().mean() * eye))
    return torch.stack(blocks)  # [H, P, P]


def align_layers(
    model,
    hidden: torch.Tensor,
    state_size: int,
    align: dict,
    seed: int,
    progress: bool = True,
    log_every: int = 10,
    first_token: bool = True,
) -> tuple[dict, pl.DataFrame]:
    """Fit one SSM head per attention head of every layer (the pure-SSM student, k = 0).

    hidden: [layers, n, T, d] teacher hidden states entering each layer. align: {steps, batch,
    lr, compute_dtype (default float32)} (config hybrid.align); compute_dtype "bfloat16": the SSM
    heads' forward and backward under bf16 autocast (targets, parameters, optimizer and loss stay
    float32). first_token: False switches the first-token share off
    (HybridMixer.first_token_share; the recipe ablation).
    Returns the SSM parameters {"<layer>.<param>": tensor} and the loss curve (relative error
    per layer)."""
    steps, batch, lr = align["steps"], align["batch"], align["lr"]
    compute_dtype = align.get("compute_dtype", "float32")
    torch.manual_seed(seed)
    student = make_hybrid(copy.deepcopy(model), [], state_size)
    for p in student.parameters():
        p.requires_grad_(False)
    ms = mixers(student)
    for m in ms:
        m.first_token_share = first_token
    params = [p for m in ms for p in m.ssm_params()]
    for p in params:
        p.requires_grad_(True)
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    metrics = [_output_metric(m) for m in ms]
    base = student.base_model
    n_layers, n_seq, length, _ = hidden.shape
    pos = torch.arange(length, device=hidden.device)[None]
    rng = torch.Generator(device="cpu").manual_seed(seed)  # the same draws on any device
    init_from_teacher_maps(ms, base, hidden, pos)
    targets = attention_targets(base, ms, hidden, batch)
    curve = []
    warmup = max(1, steps // 10)
    with tqdm(range(steps), desc=f"align n={state_size}", disable=not progress, mininterval=2.0) as bar:
        for step in bar:
            for g in opt.param_groups:
                g["lr"] = lr * _schedule(step, steps, warmup)
            pick = torch.randperm(n_seq, generator=rng, device="cpu")[:batch].to(hidden.device)
            work.add(len(pick) * length, n_layers)
            opt.zero_grad(set_to_none=True)
            per_layer = []
            for i, (layer, m, metric) in enumerate(zip(layers_of(student), ms, metrics)):
                u = mixer_input(layer, hidden[i, pick].float())
                target = targets[i, pick].float()
                with torch.autocast(u.device.type, dtype=torch.bfloat16, enabled=compute_dtype == "bfloat16"):
                    heads = m.ssm_output(u, None)
                pred = torch.einsum("blhp,hpq->blhq", heads.float(), metric)
                loss = (pred - target).square().sum() / target.square().sum().clamp_min(1e-12)
                loss.backward()  # per layer: the layers are independent, keep one graph at a time
                per_layer.append(loss.item())
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            mean = sum(per_layer) / len(per_layer)
            bar.set_postfix(rel_err=f"{mean:.3f}")
            if step % log_every == 0 or step == steps - 1:
                curve += [{"stage": "align", "step": step, "layer": i, "loss": v} for i, v in enumerate(per_layer)]
    state = snapshot(student)
    return state, pl.DataFrame(curve)


def _sliced(rope, b: int, batch: int):
    """Rotary tables (cos, sin) of windows b..b+batch (None: learned positions)."""
    return None if rope is None else tuple(t[b : b + batch] for t in rope)


def _fit_error(m: HybridMixer, u, target, metric, which, compute_dtype: str) -> torch.Tensor:
    """Relative squared error of the SSM heads of mixer `m` on windows `which` of `u` against
    `target` (teacher head outputs, both in the output metric)."""
    with torch.autocast(u.device.type, dtype=torch.bfloat16, enabled=compute_dtype == "bfloat16"):
        heads = m.ssm_output(u[which], None)
    pred = torch.einsum("blhp,hpq->blhq", heads.float(), metric)
    return (pred - target[which]).square().sum() / target[which].square().sum().clamp_min(1e-12)


@torch.no_grad()
def head_outputs(base, i: int, m: HybridMixer, hidden: torch.Tensor, heads: list[int], batch: int):
    """The outputs of attention heads `heads` of layer i (mixer `m`) on the teacher's stream
    entering it, `hidden` [n, T, d], in the output metric (_output_metric): [b, T, len(heads), P]
    per `batch` windows, in order (a generator)."""
    layer, metric = layers_of(base)[i], _output_metric(m)[heads]
    pos = torch.arange(hidden.shape[1], device=hidden.device)[None]
    for start in range(0, len(hidden), batch):
        u = mixer_input(layer, hidden[start : start + batch].float())
        rope = rotary(base, u, pos.expand(len(u), -1), i)
        yield torch.einsum("blhp,hpq->blhq", m.attention_output(u, rope, None, heads).float(), metric)


def realign_in_context(student, hidden: torch.Tensor, realign: dict, seed: int, progress: bool = True) -> pl.DataFrame:
    """Fit every layer's SSM heads of `student` (a hybrid with aligned heads; changed in place)
    again, first layer first, on the student's own stream: the input of layer i is what the
    student's layers 0..i-1 (kept heads and SSM heads as they run now) make of the windows, the
    targets are still the teacher heads' outputs on the teacher's stream `hidden` [layers, n, T, d].
    Alignment fits each head on the teacher's stream, which a student never sees past its first
    replaced head; keeping more heads exact then changes what the later SSM heads read and can cost
    retrieval (measured: Gemma 3's k = 20 below its k = 10, docs/phases.md). realign: {steps (per
    layer; 0 = none), lr, batch, compute_dtype} (config hybrid.realign). Returns per layer the SSM
    heads' relative error on the student's stream before and after, on the first four windows as
    head_errors measures alignment's (layer, error_before, error_after)."""
    steps, batch, lr = realign["steps"], realign.get("batch", 4), realign["lr"]
    compute_dtype = realign.get("compute_dtype", "float32")
    schema = {"layer": pl.Int64, "error_before": pl.Float64, "error_after": pl.Float64}
    rows = []
    if not steps:
        return pl.DataFrame(rows, schema=schema)
    hidden = hidden[:, : realign.get("windows")]
    for p in student.parameters():
        p.requires_grad_(False)
    base = student.base_model
    _, n_seq, length, _ = hidden.shape
    pos = torch.arange(length, device=hidden.device)[None]
    rng = torch.Generator(device="cpu").manual_seed(seed)
    stream = hidden[0].float()  # the embeddings: the same in teacher and student
    shown = torch.arange(min(n_seq, 4), device=hidden.device)  # the windows the errors are reported on
    warmup = max(1, steps // 10)
    pairs = list(zip(layers_of(student), mixers(student)))
    for i, (layer, m) in enumerate(tqdm(pairs, desc="realign", disable=not progress, mininterval=2.0)):
        with torch.no_grad():
            u = mixer_input(layer, stream)
            rope = rotary(base, u, pos.expand(n_seq, -1), i)
        if m.ssm_heads:
            metric = _output_metric(m)[m.ssm_heads]
            target = torch.cat(list(head_outputs(base, i, m, hidden[i], m.ssm_heads, batch)))
            with torch.no_grad():
                before = float(_fit_error(m, u, target, metric, shown, compute_dtype))
            params = m.ssm_params()
            for p in params:
                p.requires_grad_(True)
            opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
            for step in range(steps):
                for g in opt.param_groups:
                    g["lr"] = lr * _schedule(step, steps, warmup)
                pick = torch.randperm(n_seq, generator=rng, device="cpu")[:batch].to(u.device)
                work.add(len(pick) * length, 1)
                opt.zero_grad(set_to_none=True)
                _fit_error(m, u, target, metric, pick, compute_dtype).backward()
                torch.nn.utils.clip_grad_norm_(params, 1.0)
                opt.step()
            for p in params:
                p.requires_grad_(False)
            with torch.no_grad():
                after = float(_fit_error(m, u, target, metric, shown, compute_dtype))
            rows.append({"layer": i, "error_before": before, "error_after": after})
        if i == len(pairs) - 1:
            break
        with torch.no_grad():  # the stream entering the next layer, through this layer as it is now
            parts = []
            for b in range(0, n_seq, batch):
                window_rope = _sliced(rope, b, batch)
                parts.append(layer_forward(layer, stream[b : b + batch], lambda v: m(v, window_rope)[0]))  # noqa: B023
            stream = torch.cat(parts)
    return pl.DataFrame(rows, schema=schema)


@torch.no_grad()
def attention_targets(base, ms, hidden: torch.Tensor, batch: int) -> torch.Tensor:
    """[layers, n, T, H, P] (`compact`): every attention head's output for the teacher's hidden
    states `hidden` [layers, n, T, d], in the output metric (_output_metric) — what alignment
    fits, fixed, so computed once rather than at every step."""
    n_layers, n_seq = hidden.shape[:2]
    out = None
    for i, m in enumerate(ms):
        start = 0
        for heads in head_outputs(base, i, m, hidden[i], list(range(m.num_heads)), batch):
            target = compact(heads)
            if out is None:
                out = target.new_empty(n_layers, n_seq, *target.shape[1:])
            elif target.dtype == torch.float32 and out.dtype == torch.float16:  # from the first that needs it
                out = out.float()
            out[i, start : start + len(target)] = target
            start += len(target)
    return out


@torch.no_grad()
def init_from_teacher_maps(ms, base, hidden, pos, n_seq: int = 4, skip: int = 8):
    """Start every SSM head from its teacher head's attention on the first `n_seq` windows of
    `hidden` (rows from `skip` on, which see enough tokens): the output norm at the RMS of the
    teacher head's output, the first-token share at its mean attention on the first token, and,
    of the attention beside the first token, D and the local skip at its mean share on the token
    itself and the LOCAL_WIDTH tokens before, the decay from its mean distance beyond them
    (a = d / (1 + d): a geometric profile with that mean). Without it every head starts as a
    slow, smooth average, which a few hundred alignment steps cannot turn into a local head."""
    for i, (layer, m) in enumerate(zip(layers_of(base), ms)):
        if not m.ssm_heads:
            continue
        u = mixer_input(layer, hidden[i, :n_seq].float())
        rope = rotary(base, u, pos.expand(len(u), -1), i)
        target = m.attention_output(u, rope, None, m.ssm_heads)
        m.norm_weight.copy_(target.square().mean(dim=(0, 1, 3)).sqrt()[:, None].expand_as(m.norm_weight))
        length, width = u.shape[1], m.local.shape[1]
        start = min(max(skip, width), length - 1)  # short windows (tests): as many rows as there are
        probs = m.attention_probs(u, rope, m.ssm_heads, m.kept_mask(None, u))[:, :, start:]  # [B, S, L - start, L]
        if m.first_token_share:
            share = probs[..., 0].mean(dim=(0, 2)).clamp(0.01, 0.99)
            m.sink_proj.bias.copy_(torch.log(share / (1 - share)))
        if start < width:  # windows too short to see the local profile
            continue
        beside_first = (1 - probs[..., 0]).clamp_min(1e-6)
        at_offset = [
            (torch.diagonal(probs[..., start - j :], dim1=-2, dim2=-1) / beside_first).mean(dim=(0, 2))
            for j in range(width + 1)
        ]
        m.D.copy_(at_offset[0])
        m.local.copy_(torch.stack(at_offset[1:], dim=-1))
        rows = torch.arange(start, length, device=u.device)[:, None]
        distance = (rows - torch.arange(length, device=u.device)[None]).to(probs.dtype)
        far = probs * (distance > width)
        far[..., 0] = 0
        mean_distance = ((far * distance).sum(-1) / far.sum(-1).clamp_min(1e-9)).mean(dim=(0, 2)).clamp_min(1.0)
        dt = -torch.log((mean_distance / (1 + mean_distance)).clamp(0.5, 0.999))
        m.decay_proj.weight.zero_()
        m.decay_proj.bias.copy_(torch.log(torch.expm1(dt)))


@torch.no_grad()
def first_token_attention(m: HybridMixer, u: torch.Tensor, rope, heads: list[int]) -> torch.Tensor:
    """[len(heads)]: the teacher heads' mean attention probability on the first token (rows
    after the first, causal, within any window)."""
    return m.attention_probs(u, rope, heads, m.kept_mask(None, u))[:, :, 1:, 0].mean(dim=(0, 2))


@torch.no_grad()
def head_errors(model, hidden: torch.Tensor, n_seq: int = 4) -> pl.DataFrame:
    """Per SSM head of a student: relative error of its contribution to the residual stream
    against its teacher head's (given the teacher's hidden state entering the layer, on the
    first `n_seq` windows), beside the teacher head's attention on the first token."""
    base = model.base_model
    length = hidden.shape[2]
    pos = torch.arange(length, device=hidden.device)[None]
    rows = []
    for i, (layer, m) in enumerate(zip(layers_of(model), mixers(model))):
        if not m.ssm_heads:
            continue
        u = mixer_input(layer, hidden[i, :n_seq].float())
        rope = rotary(base, u, pos.expand(len(u), -1), i)
        metric = _output_metric(m)[m.ssm_heads]
        target = torch.einsum("blhp,hpq->blhq", m.attention_output(u, rope, None, m.ssm_heads).float(), metric)
        pred = torch.einsum("blhp,hpq->blhq", m.ssm_output(u, None).float(), metric)
        err = (pred - target).square().sum(dim=(0, 1, 3)) / target.square().sum(dim=(0, 1, 3)).clamp_min(1e-12)
        first = first_token_attention(m, u, rope, m.ssm_heads)
        rows += [
            {"layer": m.layer_idx, "head": h, "rel_error": float(e), "teacher_first_token_attention": float(f)}
            for h, e, f in zip(m.ssm_heads, err, first)
        ]
    return pl.DataFrame(rows)


def run_distill_align(
    model_name: str, state_size: int, inputs: Files, outputs: Files, align: dict, seed: int, dtype: str = "float32"
) -> None:
    """align_layers at `state_size` on the hidden states of the teacher file inputs.teacher (of the
    model inputs.model), with `align` {steps, batch, lr, compute_dtype}: writes the aligned SSM
    heads to outputs.weights, the loss curve to outputs.curve and the per-head errors after
    alignment (head_errors of the pure SSM) to outputs.heads, each with model and state_size
    columns."""
    weights_path, curve_path, heads_path = outputs.weights, outputs.curve, outputs.heads
    model, _ = load_model(inputs.model, dtype)
    hidden = read_tensors(inputs.teacher, ["hidden"], device_of(model))["hidden"]
    state, curve = align_layers(model, hidden, state_size, align, seed)
    write_tensors(state, weights_path)
    labels = [pl.lit(model_name).alias("model"), pl.lit(state_size).alias("state_size")]
    write_parquet(curve.with_columns(*labels), curve_path)
    errors = head_errors(load_aligned(make_hybrid(copy.deepcopy(model), [], state_size), state), hidden)
    write_parquet(errors.with_columns(*labels), heads_path)
    if not errors.is_empty():
        log.info(
            "n=%d: relative error of the SSM heads after alignment: median %.3f, worst %.3f",
            state_size,
            errors["rel_error"].median(),
            errors["rel_error"].max(),
        )


@torch.no_grad()
def load_aligned(model, aligned: dict):
    """Copy aligned SSM heads (fitted for every head) into a hybrid's SSM heads."""
    for m in mixers(model):
        n, p = m.state_size, m.head_dim
        for key, param in m.ssm_state().items():
            full = aligned[f"{m.layer_idx}.{key}"]
            rows = {"C_proj": n, "B_proj": n, "x_proj": p}.get(key.split(".")[0], 1)
            if key == "norm_weight":
                full = full.reshape(-1, p)
            if full.shape[0] != m.num_heads * rows:
                raise ValueError(
                    f"aligned state for layer {m.layer_idx} {key}: shape {tuple(full.shape)} does "
                    f"not fit {m.num_heads} heads with state size {n}"
                )
            idx = (
                torch.cat([torch.arange(h * rows, (h + 1) * rows, device=full.device) for h in m.ssm_heads])
                if m.ssm_heads
                else torch.zeros(0, dtype=torch.long, device=full.device)
            )
            param.copy_(full[idx])
    return model


# -- stage 2: end-to-end knowledge distillation --------------------------------------------------


def answer_weights(predicts_answer: torch.Tensor, answer_weight: float) -> torch.Tensor:
    """Per-position KD weights: `answer_weight` where the next token is an answer token (a KV
    value, an MMLU letter), 1 elsewhere."""
    return 1 + (float(answer_weight) - 1) * predicts_answer.float()


def snapshot(student) -> dict[str, torch.Tensor]:
    """The SSM parameters of every mixer {"<layer>.<param>": tensor} (a copy)."""
    return {f"{m.layer_idx}.{k}": v.detach().clone() for m in mixers(student) for k, v in m.ssm_state().items()}


@torch.no_grad()
def restore(student, state: dict[str, torch.Tensor]):
    """Load a snapshot (of the same student) back into its mixers."""
    for m in mixers(student):
        for k, v in m.ssm_state().items():
            v.copy_(state[f"{m.layer_idx}.{k}"])
    return student


def _cross_entropy_per_position(logits: torch.Tensor, target: torch.Tensor, top_idx: torch.Tensor) -> torch.Tensor:
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -(target * logp.gather(-1, top_idx.long())).sum(-1)


def kd_loss(
    logits: torch.Tensor, target: torch.Tensor, top_idx: torch.Tensor, weights: torch.Tensor | None = None
) -> torch.Tensor:
    """Cross-entropy of the student's next-token distribution (`logits` [B, T, V]) to the
    teacher's renormalised top-k (`target` probabilities at `top_idx`, [B, T, k]), averaged over
    positions with `weights` [B, T] (default 1). The reference of kd_backward."""
    per_position = _cross_entropy_per_position(logits, target, top_idx)
    weights = torch.ones_like(per_position) if weights is None else weights
    return (weights * per_position).sum() / weights.sum()


class _TopKCrossEntropy(torch.autograd.Function):
    """_cross_entropy_per_position with a lighter backward: the log-softmax it keeps becomes the
    softmax in place, and the target is subtracted at its top-k indices (grad = softmax ·
    Σ target − target), instead of autograd's gather backward (a zero-filled vocabulary-wide
    gradient) and log-softmax backward. A slice of 256 positions × 49k vocabulary: ~57 → ~37 ms
    forward and backward here. _cross_entropy_per_position is the reference (tested)."""

    @staticmethod
    def forward(ctx, logits, target, top_idx):
        logp = torch.log_softmax(logits.float(), dim=-1)
        ctx.save_for_backward(logp, target, top_idx)
        ctx.logits_dtype = logits.dtype
        return -(target * logp.gather(-1, top_idx)).sum(-1)

    @staticmethod
    def backward(ctx, grad):
        logp, target, top_idx = ctx.saved_tensors  # logp is this function's own: overwritten
        g = grad[:, None]
        d = logp.exp_().mul_(g * target.sum(-1, keepdim=True)).scatter_add_(-1, top_idx, -(g * target))
        return d.to(ctx.logits_dtype), None, None


# positions whose vocabulary projection kd_backward holds at once: the whole batch's logits in
# float32, their log-softmax and its gradient were the largest tensors of a training step
KD_HEAD_ROWS = 256


def kd_backward(
    student,
    ids: torch.Tensor,
    target: torch.Tensor,
    top_idx: torch.Tensor,
    weights: torch.Tensor,
    low: torch.dtype | None = None,
    head_rows: int = KD_HEAD_ROWS,
    parts: dict | None = None,
) -> float:
    """Forward and backward of kd_loss(student(ids).logits, target, top_idx, weights), the
    output head and loss (_TopKCrossEntropy) taken `head_rows` positions at a time: the decoder
    runs once, each slice's logits and gradient are freed before the next, and the gradient
    reaching the decoder's output is passed back through it once. Same gradients as kd_loss's
    backward (tested). `low`: bf16 autocast for the forward, as in distill_logits. Returns the
    loss; `parts` (a dict), when given, receives the unweighted mean cross-entropy at the
    up-weighted (answer) positions and at the others ("loss_answer", "loss_other")."""
    autocast = functools.partial(torch.autocast, ids.device.type, dtype=torch.bfloat16, enabled=low is not None)
    with autocast():
        hidden = student.base_model(input_ids=ids, use_cache=False).last_hidden_state
    work.add(ids.numel(), len(layers_of(student)))
    flat = hidden.detach().reshape(-1, hidden.shape[-1]).requires_grad_(True)
    head = student.get_output_embeddings()
    target, top_idx = target.reshape(-1, target.shape[-1]), top_idx.reshape(-1, top_idx.shape[-1])
    weights = weights.reshape(-1).float()
    total, loss = weights.sum(), 0.0
    answer = weights > weights.min()  # the up-weighted positions (none where the weights are uniform)
    sums = torch.zeros(2, dtype=torch.float64, device="cpu")  # unweighted cross-entropy: answer, other positions
    for start in range(0, len(flat), head_rows):
        rows = slice(start, start + head_rows)
        with autocast():
            logits = head(flat[rows])
        per_position = _TopKCrossEntropy.apply(logits, target[rows].float(), top_idx[rows].long())
        part = (weights[rows] * per_position).sum() / total
        part.backward()
        loss += part.item()
        detached = per_position.detach()
        sums += torch.stack([detached[answer[rows]].sum(), detached[~answer[rows]].sum()]).double().cpu()
    hidden.backward(flat.grad.view_as(hidden))
    if parts is not None:
        n_answer = int(answer.sum())
        n_other = len(answer) - n_answer
        parts["loss_answer"] = float(sums[0]) / n_answer if n_answer else float("nan")
        parts["loss_other"] = float(sums[1]) / n_other if n_other else float("nan")
    return loss


def _train_mode(student) -> None:
    student.train()
    for m in student.modules():  # the frozen teacher parts compute as in evaluation (GPT-2's dropout)
        if isinstance(m, torch.nn.Dropout):
            m.eval()


# an earlier checkpoint replaces the last only where the validation items show it better
SELECTION_ALPHA = 0.05


@dataclass
class Selection:
    """Checkpoint selection during KD: `score(student)` -> (per-item correctness, mean log-prob of
    the target) on a validation set, taken before the first step (aligned, no KD), every `every`
    steps and after the last. The best point (by accuracy, then log-prob, then the earlier step)
    replaces the last step's student only where it answers better on the same items by an exact
    McNemar test (p < SELECTION_ALPHA): a tie or a difference the items cannot show keeps the
    most trained student. `rows` (one per point, with the test's p against the last) and `chosen`
    (a step count) are filled in; `finish` decides."""

    score: Callable[[torch.nn.Module], tuple[list[bool], float]]
    every: int
    rows: list[dict] = field(default_factory=list)
    chosen: int | None = None
    correct: dict[int, list[bool]] = field(default_factory=dict)

    def due(self, steps_done: int, steps: int) -> bool:
        return steps_done == 0 or steps_done == steps or steps_done % self.every == 0

    def record(self, student, steps_done: int) -> bool:
        """Score the student after `steps_done` steps; whether it is the best point so far."""
        correct, logp = self.score(student)
        accuracy = sum(correct) / max(1, len(correct))
        best = max(self.rows, key=lambda r: (r["accuracy"], r["mean_logp"]), default=None)
        self.rows.append({"after_steps": steps_done, "accuracy": accuracy, "mean_logp": logp})
        self.correct[steps_done] = list(correct)
        return best is None or (accuracy, logp) > (best["accuracy"], best["mean_logp"])

    def finish(self, last: int) -> int:
        """The chosen step: the best point where it beats the last by the paired test, else `last`."""
        from gna.core.paired import mcnemar_p

        best = max(self.rows, key=lambda r: (r["accuracy"], r["mean_logp"]))["after_steps"]
        for row in self.rows:
            pairs = list(zip(self.correct[row["after_steps"]], self.correct[last]))
            row["p_vs_last"] = mcnemar_p(sum(a and not b for a, b in pairs), sum(b and not a for a, b in pairs))
        chosen = next(r for r in self.rows if r["after_steps"] == best)
        last_row = next(r for r in self.rows if r["after_steps"] == last)
        better = chosen["accuracy"] > last_row["accuracy"] and chosen["p_vs_last"] < SELECTION_ALPHA
        self.chosen = best if better else last
        return self.chosen


def distill_logits(
    student,
    targets: dict,
    kd: dict,
    seed: int,
    checkpoints: list[int] = (),
    progress: bool = True,
    desc: str = "kd",
    select: Selection | None = None,
) -> tuple[pl.DataFrame, dict[int, dict]]:
    """Train the student's SSM parameters to match the teacher's top-k next-token
    distribution at every position (cross-entropy to the renormalised teacher top-k, averaged
    with per-position weights, default 1). targets: {ids [n, T], top_logp and top_idx (the
    teacher's, teacher_activations), optional weights [n, T]}; kd: {steps, batch, lr,
    compute_dtype (default float32)} (config hybrid.kd). Returns the loss curve and a snapshot
    of the SSM parameters after each step count in `checkpoints` (0: before training).
    compute_dtype "bfloat16": forward and backward under bf16 autocast with the frozen weights
    held in bf16 (gna.engine.precision; trained parameters, optimizer state and loss stay float32;
    about twice as fast on CPUs with bf16 instructions). The curve's rows: the loss of each step,
    its unweighted parts at answer and other positions, the gradient norm before clipping and the
    learning rate. `select`: checkpoint selection by validation (Selection), the student left at
    the chosen step."""
    ids, top_logp, top_idx = targets["ids"], targets["top_logp"], targets["top_idx"]
    weights = targets.get("weights")
    steps, batch, lr = kd["steps"], kd["batch"], kd["lr"]
    compute_dtype = kd.get("compute_dtype", "float32")
    torch.manual_seed(seed)
    for p in student.parameters():
        p.requires_grad_(False)
    params = [p for m in mixers(student) for p in m.ssm_params() if p.numel()]
    saved = {0: snapshot(student)} if 0 in checkpoints else {}
    curve = []
    if not params or not steps:
        if select is not None:
            select.record(student, 0)
            select.finish(0)
        return pl.DataFrame(curve, schema={"stage": pl.String, "step": pl.Int64, "loss": pl.Float64}), saved
    best = None
    for p in params:
        p.requires_grad_(True)
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    rng = torch.Generator(device="cpu").manual_seed(seed)  # the same draws on any device
    target = torch.softmax(top_logp.float(), dim=-1)
    weights = torch.ones(ids.shape, device=ids.device) if weights is None else weights.float()
    warmup = kd.get("warmup") or max(1, steps // 10)
    _train_mode(student)
    low = COMPUTE_DTYPES[compute_dtype]
    frozen = contextlib.ExitStack()

    def validate(steps_done: int) -> None:
        # in the student's own precision, outside the training context (its frozen weights put
        # back, no autocast): every point is scored alike, as a model is evaluated
        nonlocal best
        frozen.close()
        student.eval()
        with torch.no_grad():
            if select.record(student, steps_done):
                best = snapshot(student)
        _train_mode(student)
        frozen.enter_context(frozen_weights_in(student, low))

    try:
        frozen.enter_context(frozen_weights_in(student, low))
        if select is not None:
            validate(0)
        with tqdm(range(steps), desc=desc, disable=not progress, mininterval=2.0) as bar:
            for step in bar:
                for g in opt.param_groups:
                    g["lr"] = lr * _schedule(step, steps, warmup)
                pick = torch.randperm(len(ids), generator=rng, device="cpu")[:batch].to(ids.device)
                opt.zero_grad(set_to_none=True)
                parts = {}
                loss = kd_backward(student, ids[pick], target[pick], top_idx[pick], weights[pick], low, parts=parts)
                grad_norm = torch.nn.utils.clip_grad_norm_(params, 1.0)
                opt.step()
                bar.set_postfix(loss=f"{loss:.3f}")
                lr_now = opt.param_groups[0]["lr"]
                curve.append(
                    {"stage": "kd", "step": step, "loss": loss, **parts, "grad_norm": float(grad_norm), "lr": lr_now}
                )
                if step + 1 in checkpoints:
                    saved[step + 1] = snapshot(student)
                if select is not None and select.due(step + 1, steps):
                    validate(step + 1)
    finally:
        frozen.close()
        student.eval()
        for p in params:
            p.requires_grad_(False)
    if select is not None and select.finish(steps) != steps:
        restore(student, best)
    return pl.DataFrame(curve), saved


def parameter_changes(start: dict[str, torch.Tensor], states: dict[str, dict[str, torch.Tensor]]) -> pl.DataFrame:
    """How far KD moved each trained parameter: per SSM parameter name and layer (snapshot keys
    "<layer>.<param>"), its size and the summed |Δ| from `start` to each state of `states`
    {label: snapshot}, one column per label ("abs_change_<label>")."""
    rows = []
    for key, before in start.items():
        layer, name = key.split(".", 1)
        row = {"layer": int(layer), "param": name, "numel": before.numel()}
        for label, state in states.items():
            row[f"abs_change_{label}"] = float((state[key].float() - before.float()).abs().sum())
        rows.append(row)
    return pl.DataFrame(rows)


def validation_scorer(tok, table: pl.DataFrame, batch_size: int) -> Callable:
    """score(student) -> (per-item correctness, mean log-prob of the target) on the KV prompts `table`
    (gna.engine.scoring.score_table): what checkpoint selection compares."""
    from gna.engine.scoring import score_table

    def score(student) -> tuple[list[bool], float]:
        scored = score_table(student, tok, table, batch_size=batch_size, progress=False)
        return scored["correct"].to_list(), float(scored["logp_target"].mean())

    return score


def run_distill_kd(
    model_name: str,
    variant: str,
    inputs: Files,
    outputs: Files,
    kd: dict,
    checkpoints: list[int],
    seed: int,
    select: dict,
    dtype: str = "float32",
    realign: dict | None = None,
) -> None:
    """Build student `variant` of model inputs.model (k{heads kept}-n{state size}): the best-ranked
    heads of inputs.ranking kept as attention, its SSM heads from the aligned file
    inputs.aligned, fitted again on its own stream by `realign` {steps, lr, batch, compute_dtype}
    (realign_in_context; None or 0 steps: not); distill_logits it on the teacher file
    inputs.teacher with `kd` {steps, batch, lr, answer_weight, compute_dtype}, its weights in
    `dtype`. `select` {by, every, batch_size}: by "validation", the student is the last step's
    unless the best checkpoint on the KV prompts inputs.validation (Selection: once aligned,
    every `every` steps, after the last) answers them better by a paired test; by "last", the
    last step's. Writes the student folder outputs.student (gna.students.spec; its spec names the chosen step), the KD
    curve outputs.curve (per step: loss and its answer/other parts, gradient norm, learning rate),
    the validation points outputs.validation_curve (none by "last"), how far KD moved each
    parameter outputs.changes (parameter_changes: to the chosen and the last step) and the SSM
    parameters after each step count of `checkpoints` to outputs.checkpoints (keys
    "<step>/<layer>.<param>"; the last step's too where another is chosen; empty without any)."""
    heads_kept, state_size = parse_variant(variant)
    model, tok = load_model(inputs.model, dtype)
    kept = ranked_heads(read_parquet(inputs.ranking), heads_kept, model_name)
    on = device_of(model)
    # the teacher's own forward is in the teacher file: the loaded model becomes the student (no copy held)
    student = load_aligned(make_hybrid(model, kept, state_size), read_tensors(inputs.aligned, None, on))
    del model
    if realign and realign["steps"]:
        errors = realign_in_context(
            student, read_tensors(inputs.teacher, ["hidden"], on)["hidden"], realign, seed, progress=True
        )
        log.info(
            "%s: realigned on its own stream; SSM heads' relative error there: median %.3f before, %.3f after",
            variant,
            errors["error_before"].median() if len(errors) else float("nan"),
            errors["error_after"].median() if len(errors) else float("nan"),
        )
    data = read_tensors(inputs.teacher, ["train_ids", "train_answers", "top_logp", "top_idx"], on)
    weights = answer_weights(data["train_answers"], kd["answer_weight"])
    targets = {"ids": data["train_ids"], "top_logp": data["top_logp"], "top_idx": data["top_idx"], "weights": weights}
    selection = None
    if select["by"] == "validation":
        table = read_parquet(inputs.validation)
        selection = Selection(validation_scorer(tok, table, select["batch_size"]), select["every"])
    aligned = snapshot(student)
    wanted = [c for c in checkpoints if c < kd["steps"]]
    if selection is not None:
        wanted.append(kd["steps"])  # the last step: its changes, and the budget curve's last point
    curve, saved = distill_logits(
        student, targets, kd, seed, checkpoints=wanted, desc=f"kd k={heads_kept} n={state_size}", select=selection
    )
    chosen = kd["steps"] if selection is None else selection.chosen
    last = saved.pop(kd["steps"], None)
    if last is None:  # without selection the student is the last step
        last = snapshot(student)
    elif checkpoints and chosen != kd["steps"]:
        saved[kd["steps"]] = last
    labels = [
        pl.lit(model_name).alias("model"),
        pl.lit(heads_kept).alias("heads_kept"),
        pl.lit(state_size).alias("state_size"),
    ]
    validation = pl.DataFrame(
        selection.rows if selection else [],
        schema={"after_steps": pl.Int64, "accuracy": pl.Float64, "mean_logp": pl.Float64, "p_vs_last": pl.Float64},
    ).with_columns((pl.col("after_steps") == chosen).alias("chosen"))
    if selection is not None:
        log.info(
            "%s: validation accuracy %s by step; chosen: after %d of %d KD steps",
            variant,
            ", ".join(f"{r['after_steps']}: {r['accuracy']:.3f}" for r in selection.rows),
            chosen,
            kd["steps"],
        )
    changes = parameter_changes(aligned, {"chosen": snapshot(student), "last": last})
    spec = hybrid_spec(
        student,
        teacher=model_name,
        heads_kept=heads_kept,
        variant=variant,
        kept_ranked=[list(h) for h in kept],
        kd_steps=kd["steps"],
        kd_tokens=kd["steps"] * kd["batch"] * data["train_ids"].shape[1],
        chosen_step=chosen,
        select=select["by"],
    )
    with atomic_dir(outputs.student) as tmp:
        save_student(student, tok, tmp, spec)
    write_tensors(
        {f"{step}/{key}": v for step, state in saved.items() for key, v in state.items()}, outputs.checkpoints
    )
    write_parquet(curve.with_columns(*labels), outputs.curve)
    write_parquet(validation.with_columns(*labels), outputs.validation_curve)
    write_parquet(changes.with_columns(*labels), outputs.changes)
