"""Distillation stage 3, KD: end-to-end knowledge distillation of one student (kept heads from
the ranking, SSM heads from alignment, realigned on its own stream) on the teacher's next-token
distributions, with checkpoint selection on validation KV prompts (run_distill_kd).
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import polars as pl
import torch
from tqdm.auto import tqdm

from gna.core import work
from gna.core.io import atomic_dir, read_parquet, write_parquet
from gna.core.settings import Files, RuleSettings
from gna.core.tensor_files import read_tensors, write_tensors
from gna.engine.device import device_of
from gna.engine.precision import COMPUTE_DTYPES, evaluated_in, frozen_weights_in, training_dtype
from gna.engine.scoring import Scorer
from gna.models.prepare import load_model
from gna.students.alignment import Realign, load_aligned, lr_schedule, realign_in_context, warmup_steps
from gna.students.mixer import layers_of, mixers, restore, snapshot
from gna.students.spec import hybrid_spec, make_hybrid, parse_variant, ranked_heads, save_student

log = logging.getLogger("gna.students.kd")


@dataclass(frozen=True)
class KD:
    """End-to-end distillation (config block hybrid.kd): `steps` steps of `batch` windows at
    learning rate `lr`, the first `warmup` share of them warming up (warmup_steps), the
    positions that predict an answer token weighted `answer_weight`; `tail_bin`: the teacher's top
    k as they are, its remaining mass one more bin (else renormalised); compute_dtype "bfloat16":
    forward and backward under bf16 autocast with the frozen weights held in bf16."""

    steps: int = 14
    batch: int = 4
    lr: float = 0.001
    answer_weight: float = 10
    compute_dtype: str = "float32"
    warmup: float = 0.1
    tail_bin: bool = False


@dataclass(frozen=True)
class Select:
    """Which KD checkpoint becomes the student (config keys hybrid.select, hybrid.validation.every,
    eval.batch_size and eval.compute_dtype): `by` "validation" (Selection on the validation KV
    prompts, scored every `every` steps, `batch_size` items per forward, the linear layers in the
    evaluation's `compute_dtype`) or "last" (the last step's)."""

    by: str = "validation"
    every: int = 7
    batch_size: int = 8
    compute_dtype: str = "float32"

    def selection(self, tok, validation_path: str) -> Selection | None:
        """The Selection of a KD run on the KV prompts at `validation_path` (by "validation"), or
        None (by "last")."""
        if self.by != "validation":
            return None
        table = read_parquet(validation_path)
        return Selection(validation_scorer(tok, table, self.batch_size, self.compute_dtype), self.every)


@dataclass
class KDBatch:
    """One KD step's windows: token `ids` [B, T], the teacher's top-k probabilities `target` at
    `top_idx` [B, T, k] (renormalised, or with `tail` the teacher's own, the rest of its mass one
    more bin) and the per-position loss `weights` [B, T]."""

    ids: torch.Tensor
    target: torch.Tensor
    top_idx: torch.Tensor
    weights: torch.Tensor
    tail: bool = False


def answer_weights(predicts_answer: torch.Tensor, answer_weight: float) -> torch.Tensor:
    """Per-position KD weights: `answer_weight` where the next token is an answer token (a KV
    value, an MMLU letter), 1 elsewhere."""
    return 1 + (float(answer_weight) - 1) * predicts_answer.float()


def _cross_entropy_per_position(
    logits: torch.Tensor, target: torch.Tensor, top_idx: torch.Tensor, tail: bool = False
) -> torch.Tensor:
    logp = torch.log_softmax(logits.float(), dim=-1)
    loss = -(target * logp.gather(-1, top_idx.long())).sum(-1)
    if tail:  # the teacher's mass outside its top k against the student's there (every other token)
        rest = logp.scatter(-1, top_idx.long(), float("-inf")).logsumexp(-1)
        loss = loss - (1 - target.sum(-1)).clamp_min(0) * rest
    return loss


def kd_loss(
    logits: torch.Tensor,
    target: torch.Tensor,
    top_idx: torch.Tensor,
    weights: torch.Tensor | None = None,
    tail: bool = False,
) -> torch.Tensor:
    """Cross-entropy of the student's next-token distribution (`logits` [B, T, V]) to the
    teacher's top-k (`target` probabilities at `top_idx`, [B, T, k]: renormalised, or with `tail`
    the teacher's own, its remaining mass a (k+1)-th bin matched to the student's mass on every
    other token), averaged over positions with `weights` [B, T] (default 1). The reference of
    kd_backward."""
    per_position = _cross_entropy_per_position(logits, target, top_idx, tail)
    weights = torch.ones_like(per_position) if weights is None else weights
    return (weights * per_position).sum() / weights.sum()


class _TopKCrossEntropy(torch.autograd.Function):
    """_cross_entropy_per_position with a lighter backward: the log-softmax it keeps becomes the
    softmax in place, and the target is subtracted at its top-k indices (grad = softmax ·
    Σ target − target), instead of autograd's gather backward (a zero-filled vocabulary-wide
    gradient) and log-softmax backward. A slice of 256 positions × 49k vocabulary: ~57 → ~37 ms
    forward and backward here. _cross_entropy_per_position is the reference (tested)."""

    @staticmethod
    def forward(ctx, logits, target, top_idx, tail=False):
        logp = torch.log_softmax(logits.float(), dim=-1)
        top = logp.gather(-1, top_idx)
        loss = -(target * top).sum(-1)
        # with the tail bin: t = the teacher's mass outside its top k, S = the student's inside it
        t, s = torch.zeros_like(loss), torch.zeros_like(loss)
        if tail:
            t, s = (1 - target.sum(-1)).clamp_min(0), top.exp().sum(-1).clamp_max(1 - 1e-6)
            loss = loss - t * torch.log1p(-s)
        ctx.save_for_backward(logp, target, top_idx, t, s)
        ctx.logits_dtype = logits.dtype
        return loss

    @staticmethod
    def backward(ctx, grad):
        logp, target, top_idx, t, s = ctx.saved_tensors  # logp is this function's own: overwritten
        g = grad[:, None]
        # d/dz_j = p_j (Σ target − t S / (1 − S)) + [j in top] (t p_j / (1 − S) − target_j)
        odds = (t / (1 - s))[:, None]
        scale = target.sum(-1, keepdim=True) - odds * s[:, None]
        p = logp.exp_()
        at_top = p.gather(-1, top_idx) * odds - target
        d = p.mul_(g * scale).scatter_add_(-1, top_idx, g * at_top)
        return d.to(ctx.logits_dtype), None, None, None


# positions whose vocabulary projection kd_backward holds at once: the whole batch's logits in
# float32, their log-softmax and its gradient were the largest tensors of a training step
KD_HEAD_ROWS = 256


def kd_backward(
    student, batch: KDBatch, low: torch.dtype | None = None, head_rows: int = KD_HEAD_ROWS, parts: dict | None = None
) -> float:
    """Forward and backward of kd_loss(student(ids).logits, target, top_idx, weights) on the
    windows `batch` (KDBatch), the output head and loss (_TopKCrossEntropy) taken `head_rows`
    positions at a time: the decoder runs once, each slice's logits and gradient are freed before
    the next, and the gradient reaching the decoder's output is passed back through it once. Same
    gradients as kd_loss's backward (tested). `low`: bf16 autocast for the forward, as in distill_logits. Returns the
    loss; `parts` (a dict), when given, receives the unweighted mean cross-entropy at the
    up-weighted (answer) positions and at the others ("loss_answer", "loss_other")."""
    ids, target, top_idx, weights = batch.ids, batch.target, batch.top_idx, batch.weights
    autocast = functools.partial(torch.autocast, ids.device.type, dtype=torch.bfloat16, enabled=low is not None)
    with autocast():
        hidden = student.base_model(input_ids=ids, use_cache=False).last_hidden_state
    layers = layers_of(student)
    work.add(ids.numel(), len(layers), work.TRAINING * ids.numel() * sum(work.linear_flops(la) for la in layers))
    flat = hidden.detach().reshape(-1, hidden.shape[-1]).requires_grad_(True)
    head = student.get_output_embeddings()
    work.add_flops(work.TRAINING * 2 * flat.shape[0] * head.weight.numel())
    target, top_idx = target.reshape(-1, target.shape[-1]), top_idx.reshape(-1, top_idx.shape[-1])
    weights = weights.reshape(-1).float()
    total, loss = weights.sum(), 0.0
    answer = weights > weights.min()  # the up-weighted positions (none where the weights are uniform)
    sums = torch.zeros(2, dtype=torch.float64, device="cpu")  # unweighted cross-entropy: answer, other positions
    for start in range(0, len(flat), head_rows):
        rows = slice(start, start + head_rows)
        with autocast():
            logits = head(flat[rows])
        per_position = _TopKCrossEntropy.apply(logits, target[rows].float(), top_idx[rows].long(), batch.tail)
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


def better_than_last_p(candidates: list[list[bool]], last: list[bool]) -> list[float]:
    """Per candidate checkpoint, the exact one-sided McNemar p-value (scipy's binomial) that it
    answers the validation items better than the last step's student (items it alone answers
    against items the last alone answers)."""
    import numpy as np
    from scipy.stats import binom

    if not candidates:
        return []
    points, last_arr = np.asarray(candidates, dtype=bool), np.asarray(last, dtype=bool)
    gained, lost = (points & ~last_arr).sum(axis=1), (~points & last_arr).sum(axis=1)
    # P(at least `gained` of the changed items go the candidate's way) under no difference
    return [float(p) for p in np.where(gained + lost > 0, binom.sf(gained - 1, gained + lost, 0.5), 1.0)]


@dataclass
class Selection:
    """Checkpoint selection during KD: `score(student)` -> (per-item correctness, mean log-prob of
    the target) on a validation set, taken before the first step (aligned, no KD), every `every`
    steps and after the last. Each earlier point is tested against the last step's student on the
    same items (exact one-sided McNemar: does it answer better?), Holm-corrected over the K - 1
    candidates (statsmodels), so that with every point equally good the last is replaced at most
    5% of the time whatever K; the best point among those the corrected test shows better (by
    accuracy, then log-prob, then the earlier step) replaces the last, else the most trained
    student stays. `rows` (one per point, with `p_vs_last` and `p_holm_vs_last`) and `chosen` (a
    step count) are filled in; `finish` decides."""

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

    def points(self) -> str:
        """The validation accuracy of each point, for the log ("0: 0.960, 7: 1.000, …")."""
        return ", ".join(f"{r['after_steps']}: {r['accuracy']:.3f}" for r in self.rows)

    def finish(self, last: int) -> int:
        """The chosen step: the best of the points the Holm-corrected test shows better than the
        last, else `last`."""
        from gna.core.paired import holm

        candidates = [r for r in self.rows if r["after_steps"] != last]
        p = better_than_last_p([self.correct[r["after_steps"]] for r in candidates], self.correct[last])
        for row, raw, adjusted in zip(candidates, p, holm(p)):
            row["p_vs_last"], row["p_holm_vs_last"] = raw, adjusted
        for row in self.rows:
            if row["after_steps"] == last:
                row["p_vs_last"], row["p_holm_vs_last"] = None, None
        shown = [r for r in candidates if r["p_holm_vs_last"] < SELECTION_ALPHA]
        best = max(shown, key=lambda r: (r["accuracy"], r["mean_logp"], -r["after_steps"]), default=None)
        self.chosen = best["after_steps"] if best is not None else last
        return self.chosen


@dataclass(frozen=True)
class Watch:
    """What a KD run keeps and shows besides training (distill_logits): a snapshot of the SSM
    parameters after each step count of `checkpoints` (0: before training), checkpoint selection
    `select` (Selection; None: the last step's student) and a progress bar labelled `desc`
    (`progress`: whether it shows)."""

    checkpoints: tuple[int, ...] | list[int] = ()
    select: Selection | None = None
    progress: bool = True
    desc: str = "kd"


def distill_logits(
    student, targets: dict, kd: KD, seed: int, watch: Watch = Watch()
) -> tuple[pl.DataFrame, dict[int, dict]]:
    """Train the student's SSM parameters to match the teacher's top-k next-token
    distribution at every position (cross-entropy to the renormalised teacher top-k, averaged
    with per-position weights, default 1). targets: {ids [n, T], top_logp and top_idx (the
    teacher's, teacher_activations), optional weights [n, T]}; kd: the steps, batch, learning rate,
    warmup and compute dtype (KD, config hybrid.kd). Returns the loss curve and a snapshot
    of the SSM parameters after each step count in watch.checkpoints (0: before training).
    compute_dtype "bfloat16": forward and backward under bf16 autocast with the frozen weights
    held in bf16 (gna.engine.precision; trained parameters, optimizer state and loss stay float32;
    about twice as fast on CPUs with bf16 instructions). The curve's rows: the loss of each step,
    its unweighted parts at answer and other positions, the gradient norm before clipping and the
    learning rate. watch.select: checkpoint selection by validation (Selection), the student left
    at the chosen step."""
    ids, top_logp, top_idx = targets["ids"], targets["top_logp"], targets["top_idx"]
    weights = targets.get("weights")
    steps, batch, lr = kd.steps, kd.batch, kd.lr
    compute_dtype = kd.compute_dtype
    checkpoints, select, progress, desc = watch.checkpoints, watch.select, watch.progress, watch.desc
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
    # the teacher's top k renormalised, or as they are with the rest of its mass a tail bin (KD.tail_bin)
    target = top_logp.float().exp() if kd.tail_bin else torch.softmax(top_logp.float(), dim=-1)
    weights = torch.ones(ids.shape, device=ids.device) if weights is None else weights.float()
    warmup = warmup_steps(steps, kd.warmup)
    _train_mode(student)
    low = COMPUTE_DTYPES[training_dtype(ids.device, compute_dtype, "hybrid.kd")]
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
                    g["lr"] = lr * lr_schedule(step, steps, warmup)
                pick = torch.randperm(len(ids), generator=rng, device="cpu")[:batch].to(ids.device)
                opt.zero_grad(set_to_none=True)
                parts = {}
                loss = kd_backward(
                    student,
                    KDBatch(ids[pick], target[pick], top_idx[pick], weights[pick], kd.tail_bin),
                    low,
                    parts=parts,
                )
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


def validation_scorer(tok, table: pl.DataFrame, batch_size: int, compute_dtype: str = "float32") -> Callable:
    """score(student) -> (per-item correctness, mean log-prob of the target) on the KV prompts `table`
    (gna.engine.scoring.score_table) with the linear layers multiplying in `compute_dtype` as the
    evaluation's do (eval.compute_dtype; evaluated_in): what checkpoint selection compares."""
    from gna.engine.scoring import score_table

    def score(student) -> tuple[list[bool], float]:
        with evaluated_in(student, compute_dtype):
            scored = score_table(Scorer(student, tok, batch_size=batch_size, progress=False), table)
        return scored["correct"].to_list(), float(scored["logp_target"].mean())

    return score


@dataclass(frozen=True)
class DistillKD(RuleSettings):
    """Rule distill_kd's settings: student `variant` (k{heads kept}-n{state size}, from the
    wildcards k and n) of `model` (wildcard model), realigned by `realign` (hybrid.realign; None:
    not), distilled by `kd` (hybrid.kd) with `seed` (hybrid.seed) and its checkpoint chosen by
    `select`; the SSM parameters kept after each step count of `checkpoints` (the budget curve's,
    for its variants); the model loaded in `dtype` (config key dtype)."""

    model: str
    variant: str
    kd: KD = KD()
    checkpoints: tuple[int, ...] = ()
    seed: int = 99
    select: Select = Select()
    dtype: str = "float32"
    realign: Realign | None = None


def run_distill_kd(inputs: Files, outputs: Files, settings: DistillKD) -> None:
    """Build student settings.variant of model inputs.model (k{heads kept}-n{state size}): the
    best-ranked heads of inputs.ranking kept as attention, its SSM heads from the aligned file
    inputs.aligned, fitted again on its own stream by settings.realign (realign_in_context; None
    or 0 steps: not); distill_logits it on the teacher file inputs.teacher with settings.kd, its
    weights in settings.dtype. settings.select: by "validation", the student is the last step's
    unless the best checkpoint on the KV prompts inputs.validation (Selection: once aligned,
    every `every` steps, after the last) answers them better by a paired test; by "last", the
    last step's. Writes the student folder outputs.student (gna.students.spec; its spec names the
    chosen step), the KD curve outputs.curve (per step: loss and its answer/other parts, gradient
    norm, learning rate), the validation points outputs.validation_curve (none by "last"), how far
    KD moved each parameter outputs.changes (parameter_changes: to the chosen and the last step)
    and the SSM parameters after each step count of settings.checkpoints to outputs.checkpoints
    (keys "<step>/<layer>.<param>"; the last step's too where another is chosen; empty without
    any)."""
    model_name, variant, kd, realign, select = (
        settings.model,
        settings.variant,
        settings.kd,
        settings.realign,
        settings.select,
    )
    checkpoints, seed = list(settings.checkpoints), settings.seed
    heads_kept, state_size = parse_variant(variant)
    model, tok = load_model(inputs.model, settings.dtype)
    kept = ranked_heads(read_parquet(inputs.ranking), heads_kept, model_name)
    on = device_of(model)
    # the teacher's own forward is in the teacher file: the loaded model becomes the student (no copy held)
    student = load_aligned(make_hybrid(model, kept, state_size), read_tensors(inputs.aligned, None, on))
    del model
    if realign and realign.steps:
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
    weights = answer_weights(data["train_answers"], kd.answer_weight)
    targets = {"ids": data["train_ids"], "top_logp": data["top_logp"], "top_idx": data["top_idx"], "weights": weights}
    selection = select.selection(tok, inputs.validation)
    aligned = snapshot(student)
    wanted = [c for c in checkpoints if c < kd.steps]
    if selection is not None:
        wanted.append(kd.steps)  # the last step: its changes, and the budget curve's last point
    watch = Watch(checkpoints=wanted, select=selection, desc=f"kd k={heads_kept} n={state_size}")
    curve, saved = distill_logits(student, targets, kd, seed, watch)
    chosen = kd.steps if selection is None else selection.chosen
    last = saved.pop(kd.steps, None)
    if last is None:  # without selection the student is the last step
        last = snapshot(student)
    elif checkpoints and chosen != kd.steps:
        saved[kd.steps] = last
    labels = [
        pl.lit(model_name).alias("model"),
        pl.lit(heads_kept).alias("heads_kept"),
        pl.lit(state_size).alias("state_size"),
    ]
    validation = pl.DataFrame(
        selection.rows if selection else [],
        schema={
            "after_steps": pl.Int64,
            "accuracy": pl.Float64,
            "mean_logp": pl.Float64,
            "p_vs_last": pl.Float64,
            "p_holm_vs_last": pl.Float64,
        },
    ).with_columns((pl.col("after_steps") == chosen).alias("chosen"))
    if selection is not None:
        log.info(
            "%s: validation accuracy %s by step; chosen: after %d of %d KD steps",
            variant,
            selection.points(),
            chosen,
            kd.steps,
        )
    changes = parameter_changes(aligned, {"chosen": snapshot(student), "last": last})
    spec = hybrid_spec(
        student,
        teacher=model_name,
        heads_kept=heads_kept,
        variant=variant,
        kept_ranked=[list(h) for h in kept],
        kd_steps=kd.steps,
        kd_tokens=kd.steps * kd.batch * data["train_ids"].shape[1],
        chosen_step=chosen,
        select=select.by,
    )
    with atomic_dir(outputs.student) as tmp:
        save_student(student, tok, tmp, spec)
    write_tensors(
        {f"{step}/{key}": v for step, state in saved.items() for key, v in state.items()}, outputs.checkpoints
    )
    write_parquet(curve.with_columns(*labels), outputs.curve)
    write_parquet(validation.with_columns(*labels), outputs.validation_curve)
    write_parquet(changes.with_columns(*labels), outputs.changes)
