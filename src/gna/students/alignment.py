"""Distillation stage 2, alignment: layer-local fits of the SSM heads to the teacher's heads.

align     once per state size (run_distill_align): given the teacher's hidden state h_i, every
          SSM head of layer i is fitted to reproduce its attention head's contribution to
          h_{i+1} (the head output seen through o_proj). Heads are fitted independently, so one
          alignment serves every heads-kept variant with that state size; the kept heads and the
          MLPs are the teacher's own, so a perfect fit reproduces h_{i+1}.
realign   per student, the first part of its KD job (realign_in_context): every layer's SSM
          heads fitted again, first layer first, on the stream the student itself produces
          entering that layer: the student never sees the teacher's stream past its first
          replaced head.
"""

from __future__ import annotations

import copy
import logging
import math
from dataclasses import dataclass

import polars as pl
import torch
from tqdm.auto import tqdm

from gna.core import work
from gna.core.io import write_parquet
from gna.core.settings import Files, RuleSettings
from gna.core.tensor_files import compact, read_tensors, write_tensors
from gna.engine.device import device_of
from gna.engine.precision import training_dtype
from gna.models.prepare import load_model
from gna.students.mixer import HybridMixer, layer_forward, layers_of, mixer_input, mixers, rotary, snapshot
from gna.students.spec import make_hybrid

log = logging.getLogger("gna.students.alignment")


# every how many steps alignment's loss curve records each layer's error (and at the last step)
CURVE_EVERY = 10


@dataclass(frozen=True)
class Align:
    """Layer alignment (config block hybrid.align): `steps` steps of `batch` windows at learning
    rate `lr`, the first `warmup` share of them warming up (warmup_steps); compute_dtype
    "bfloat16": the SSM heads' forward and backward under bf16 autocast (targets, parameters,
    optimizer and loss stay float32). `first_token`: False switches the
    first-token share off (HybridMixer.first_token_share; the recipe's no_first_token ablation,
    not a config key)."""

    steps: int = 80
    batch: int = 4
    lr: float = 0.005
    compute_dtype: str = "float32"
    first_token: bool = True
    warmup: float = 0.1


@dataclass(frozen=True)
class Realign:
    """Realignment on the student's own stream (config block hybrid.realign): `steps` steps per
    layer (0: none) of `batch` windows at learning rate `lr` with `warmup` as in Align, on the
    first `windows` alignment windows (None: all); compute_dtype as in Align."""

    steps: int = 10
    lr: float = 0.002
    batch: int = 4
    compute_dtype: str = "float32"
    windows: int | None = None
    warmup: float = 0.1


def warmup_steps(steps: int, share: float) -> int:
    """The warmup steps of a stage of `steps` steps (config key warmup of hybrid.align, realign and
    kd): the first `share` of them, at least one. Adam's first update moves every weight by about
    the learning rate whatever the gradient's scale, so the first step runs at 1/warmup of it."""
    if not 0 <= share < 1:
        raise ValueError(f"warmup: {share!r} is not a share of the steps in [0, 1)")
    return max(1, math.floor(share * steps + 1e-9))


def lr_schedule(step: int, steps: int, warmup: int) -> float:
    """Learning-rate factor: linear warmup over `warmup` steps, then cosine decay to 0."""
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
    model, hidden: torch.Tensor, state_size: int, align: Align, seed: int, progress: bool = True
) -> tuple[dict, pl.DataFrame]:
    """Fit one SSM head per attention head of every layer (the pure-SSM student, k = 0).

    hidden: [layers, n, T, d] teacher hidden states entering each layer. align: the steps, batch,
    learning rate, compute dtype and first-token share (Align, config hybrid.align).
    Returns the SSM parameters {"<layer>.<param>": tensor} and the loss curve (relative error
    per layer, every CURVE_EVERY steps and at the last)."""
    steps, batch, lr = align.steps, align.batch, align.lr
    compute_dtype, first_token = training_dtype(hidden.device, align.compute_dtype, "hybrid.align"), align.first_token
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
    warmup = warmup_steps(steps, align.warmup)
    # per token: the SSM projections (the teacher's q/k/v/o do not run in a step); the scans' own FLOPs are not counted
    mixer_flops = sum(work.linear_flops(p) for m in ms for p in m.ssm_projections)
    with tqdm(range(steps), desc=f"align n={state_size}", disable=not progress, mininterval=2.0) as bar:
        for step in bar:
            for g in opt.param_groups:
                g["lr"] = lr * lr_schedule(step, steps, warmup)
            pick = torch.randperm(n_seq, generator=rng, device="cpu")[:batch].to(hidden.device)
            work.add(len(pick) * length, n_layers, work.TRAINING * len(pick) * length * mixer_flops)
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
            if step % CURVE_EVERY == 0 or step == steps - 1:
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


def realign_in_context(
    student, hidden: torch.Tensor, realign: Realign, seed: int, progress: bool = True
) -> pl.DataFrame:
    """Fit every layer's SSM heads of `student` (a hybrid with aligned heads; changed in place)
    again, first layer first, on the student's own stream: the input of layer i is what the
    student's layers 0..i-1 (kept heads and SSM heads as they run now) make of the windows, the
    targets are still the teacher heads' outputs on the teacher's stream `hidden` [layers, n, T, d].
    Alignment fits each head on the teacher's stream, which a student never sees past its first
    replaced head; keeping more heads exact then changes what the later SSM heads read and can cost
    retrieval (measured: Gemma 3's k = 20 below its k = 10, docs/phases.md). realign: its steps per
    layer (0 = none), learning rate, batch, compute dtype and windows (Realign, config
    hybrid.realign). Returns per layer the SSM
    heads' relative error on the student's stream before and after, on the first four windows as
    head_errors measures alignment's (layer, error_before, error_after)."""
    steps, batch, lr = realign.steps, realign.batch, realign.lr
    compute_dtype = realign.compute_dtype
    schema = {"layer": pl.Int64, "error_before": pl.Float64, "error_after": pl.Float64}
    rows = []
    if not steps:
        return pl.DataFrame(rows, schema=schema)
    compute_dtype = training_dtype(hidden.device, compute_dtype, "hybrid.realign")
    hidden = hidden[:, : realign.windows]
    for p in student.parameters():
        p.requires_grad_(False)
    base = student.base_model
    _, n_seq, length, _ = hidden.shape
    pos = torch.arange(length, device=hidden.device)[None]
    rng = torch.Generator(device="cpu").manual_seed(seed)
    stream = hidden[0].float()  # the embeddings: the same in teacher and student
    shown = torch.arange(min(n_seq, 4), device=hidden.device)  # the windows the errors are reported on
    warmup = warmup_steps(steps, realign.warmup)
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
                    g["lr"] = lr * lr_schedule(step, steps, warmup)
                pick = torch.randperm(n_seq, generator=rng, device="cpu")[:batch].to(u.device)
                flops = work.TRAINING * len(pick) * length * sum(work.linear_flops(p) for p in m.ssm_projections)
                work.add(len(pick) * length, 1, flops)
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


@dataclass(frozen=True)
class DistillAlign(RuleSettings):
    """Rule distill_align's settings: the `model` (wildcard model) aligned at `state_size`
    (wildcard n) by `align` (hybrid.align) with `seed` (hybrid.seed), loaded in `dtype` (config
    key dtype)."""

    model: str
    state_size: int
    align: Align = Align()
    seed: int = 99
    dtype: str = "float32"


def run_distill_align(inputs: Files, outputs: Files, settings: DistillAlign) -> None:
    """align_layers at settings.state_size on the hidden states of the teacher file inputs.teacher
    (of the model inputs.model), with settings.align: writes the aligned SSM heads to
    outputs.weights, the loss curve to outputs.curve and the per-head errors after alignment
    (head_errors of the pure SSM) to outputs.heads, each with model and state_size columns."""
    model_name, state_size = settings.model, settings.state_size
    weights_path, curve_path, heads_path = outputs.weights, outputs.curve, outputs.heads
    model, _ = load_model(inputs.model, settings.dtype)
    hidden = read_tensors(inputs.teacher, ["hidden"], device_of(model))["hidden"]
    state, curve = align_layers(model, hidden, state_size, settings.align, settings.seed)
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
