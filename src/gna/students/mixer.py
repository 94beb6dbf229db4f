"""The hybrid mixer: a teacher transformer's attention module whose heads are, head by head,
either kept as attention (the teacher's own q/k/v/o weights) or replaced by an SSM head (gna.engine.ssm).

Design: head-wise replacement. Each layer's attention module becomes a `HybridMixer` that
computes every query head's output — by softmax attention for kept heads, by a selective scan
for the others — and sends the concatenation through the teacher's shared o_proj. A head's
place in the model therefore never changes, so the head ranking names the same head in
teacher and student, and k = 0 is a pure SSM with the teacher's MLPs. An SSM head starts from
its attention head (C ← Q of the head, B ← K and x ← V of its K/V group, decays spread over
time scales as in Mamba), then distillation fits it (gna.students.alignment, gna.students.kd). Beside the scan,
each SSM head reads the last few tokens' values directly (the local skip, gna.engine.ssm) and
the first token's value through a fitted share (an attention sink).

This module is the layer and the tools that act on a model's mixers (`mixers`, the layer swap,
captured head maps). Building, naming, saving and loading students is gna.students.spec;
whole-model recurrent decoding and inference memory is gna.students.decoding.
"""

from __future__ import annotations

import contextlib
import inspect
import math
import warnings
import weakref

import torch
import torch.nn.functional as F
from torch import nn

from gna.engine.anatomy import sliding_windows
from gna.engine.precision import linear_group
from gna.engine.ssm import (
    ScanInputs,
    TreeLayout,
    local_matrix,
    local_mix,
    local_mix_causal,
    materialize,
    ssd_recurrent,
    ssd_scan,
    ssd_tree,
    tree_layout,
)

C_INIT_SCALE = 0.03
SINK_INIT = 0.3  # teacher heads put about a third of their attention on the first token
LOCAL_WIDTH = 3  # tokens before each position read by the local skip (with D: 4, Mamba's conv width)


def _rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _rope(x, position_embeddings):
    """Rotary embedding of x [B, heads, L, P] by (cos, sin) [B, L, R]: the first R channels of
    each head (R < P: partial rotary, GPT-NeoX, some Phi-3), none where the family has learned
    positions instead (GPT-2: position_embeddings None)."""
    if position_embeddings is None:
        return x
    cos, sin = position_embeddings
    r = cos.shape[-1]
    turned = x[..., :r] * cos[:, None] + _rotate_half(x[..., :r]) * sin[:, None]
    return turned if r == x.shape[-1] else torch.cat([turned, x[..., r:]], dim=-1)


def _visibility(attention_mask, batch: int, length: int):
    """(structure, per_head) from a Llama-style mask: structure is the [B, L, L] bool visibility
    (l may read s; None = plain causal) that defines the sequence layout; per_head is a
    [B, H, L, L] bool mask when the caller restricts heads individually (G&A masking), else None.
    Per-head masks only remove entries from the layout, so the layout is their union."""
    if attention_mask is None:
        return None, None
    mask = attention_mask if attention_mask.dim() == 4 else attention_mask[:, None]
    allowed = mask if mask.dtype == torch.bool else mask == 0
    if allowed.shape[1] > 1:
        return allowed.any(1).expand(batch, length, length), allowed.expand(batch, -1, length, length)
    return allowed[:, 0].expand(batch, length, length), None


# what was derived from the last few masks (their TreeLayout, their sequence layout): every layer
# of one forward gets the same mask object (windowed layers another one), so each is found once
# per batch, not once per layer; [(weak reference to the mask, its version, key, value)]
_derived: list = []


def derived_from(attention_mask, key, compute):
    """compute() for `attention_mask`, reused while the same, unmodified mask comes back with the
    same key (the next layers of the same forward)."""
    # inference tensors keep no version counter (and masks are not edited in place between layers)
    current = None if attention_mask.is_inference() else attention_mask._version
    for ref, version, k, value in _derived:
        if k == key and ref() is attention_mask and version == current:
            return value
    value = compute()
    _derived.insert(0, (weakref.ref(attention_mask), current, key, value))
    del _derived[4:]
    return value


def layout_of(attention_mask, allowed) -> TreeLayout | None:
    """tree_layout(allowed) of a forward's mask (`allowed`: the sequence layout read from it)."""
    return derived_from(attention_mask, "layout", lambda: tree_layout(allowed))


def unwindowed(allowed: torch.Tensor) -> torch.Tensor:
    """The sequence layout [B, L, L] (bool) of a visibility narrowed to a sliding window by
    positions: each row sees its oldest visible token's row plus its own window, repeated until
    nothing changes (about L / window rounds). Exact where the layout is tree-shaped (causal,
    packed, padded) and the window covers at least two tokens."""
    oldest = allowed.to(torch.uint8).argmax(-1)  # the first visible position of each row
    seen = allowed.any(-1, keepdim=True)
    full = allowed
    while True:
        reach = torch.gather(full, 1, oldest[..., None].expand_as(full)) & seen
        grown = allowed | reach
        if torch.equal(grown, full):
            return full
        full = grown


def windowed(structure: torch.Tensor, window: int) -> torch.Tensor:
    """`structure` [B, L, L] narrowed to a sliding window by positions (a row's position: the
    number of tokens it sees, less one): a query at position p sees keys at positions > p − window,
    as the engine's packed batches and transformers' own sliding masks do."""
    position = structure.sum(-1) - 1
    return structure & (position[:, :, None] - position[:, None, :] < window)


def norm_gain(norm: nn.Module) -> torch.Tensor:
    """The per-channel gain a q/k RMS norm multiplies by: its weight (Llama-style norms), or
    1 + weight where the norm stores the gain as an offset from 1 (Gemma's), read from the norm's
    output on a vector of ones (whose RMS is 1)."""
    w = norm.weight.detach()
    with torch.no_grad():
        probe = norm(torch.ones(1, w.numel(), dtype=w.dtype, device=w.device))[0]
    return w if torch.allclose(probe, w, rtol=1e-3, atol=1e-5) else w + 1


def _linear_rows(weight: torch.Tensor, bias: torch.Tensor | None, rows) -> nn.Linear:
    """An nn.Linear holding `rows` of a fused projection's weight [out, in] (and bias), copied:
    the student keeps one projection per role whatever the teacher fused."""
    out = nn.Linear(weight.shape[1], len(rows), bias=bias is not None, device=weight.device, dtype=weight.dtype)
    with torch.no_grad():
        out.weight.copy_(weight[rows])
        if bias is not None:
            out.bias.copy_(bias[rows])
    return out


def projections(attn: nn.Module, n_heads: int, n_kv: int, head_dim: int) -> tuple[nn.Module, ...]:
    """(q, k, v, o) projections of a teacher's attention module: its own q_proj/k_proj/v_proj/
    o_proj, or split from a fused one: Phi-3's qkv_proj (rows q | k | v), GPT-NeoX's
    query_key_value (per head: q, k, v rows of that head) and GPT-2's Conv1D c_attn (stored
    [in, out]: columns q | k | v). The output projection is the teacher's module (o_proj, dense,
    c_proj), called as it is."""
    if hasattr(attn, "q_proj"):
        return attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj
    q_rows, kv_rows = n_heads * head_dim, n_kv * head_dim
    if hasattr(attn, "qkv_proj") or hasattr(attn, "c_attn"):
        fused = attn.qkv_proj if hasattr(attn, "qkv_proj") else attn.c_attn
        weight = fused.weight if hasattr(attn, "qkv_proj") else fused.weight.T
        spans = ((0, q_rows), (q_rows, q_rows + kv_rows), (q_rows + kv_rows, q_rows + 2 * kv_rows))
        rows = [torch.arange(a, b, device=weight.device) for a, b in spans]
        out = attn.o_proj if hasattr(attn, "o_proj") else attn.c_proj
    elif hasattr(attn, "query_key_value"):
        fused, out = attn.query_key_value, attn.dense
        weight = fused.weight
        per_head = torch.arange(n_heads * 3 * head_dim, device=weight.device).view(n_heads, 3, head_dim)
        rows = [per_head[:, j].reshape(-1) for j in range(3)]
    else:
        raise TypeError(f"{type(attn).__name__}: no q/k/v projections (q_proj, qkv_proj, query_key_value, c_attn)")
    return (*(_linear_rows(weight, fused.bias, r) for r in rows), out)


def _matmul_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype o_proj will multiply `x`'s heads in: autocast's where it is on (the heads are
    then gathered in it directly: the same values o_proj's own cast would give, without a float32
    copy of every layer's heads and the casts back and forth in the backward), else x's."""
    if torch.is_autocast_enabled(x.device.type):
        return torch.get_autocast_dtype(x.device.type)
    return x.dtype


class HybridMixer(nn.Module):
    """Drop-in replacement for an attention module with separate q/k/v/o projections and rotary
    positions (same call signature): Llama, Mistral, Qwen2, with their q/k norms Qwen3 and Gemma 3
    (per head) and OLMo-2 (over the whole projection), with attention soft-capping Gemma 2.

    Sliding-window layers (Mistral, Qwen2, Gemma 2/3): kept heads keep the teacher's window; SSM
    heads replace it (they read the whole sequence, as a scan does). Such a layer may be handed
    the windowed mask (the model's own forward, the engine); the mixer recovers the sequence
    layout from it (`unwindowed`) and applies the window itself (`windowed`), by positions."""

    def __init__(self, attn: nn.Module, config, ssm_heads: list[int], state_size: int, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = getattr(config, "num_key_value_heads", None) or self.num_heads
        self.head_dim = (
            getattr(attn, "head_dim", None) or getattr(attn, "head_size", None) or config.hidden_size // self.num_heads
        )
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = projections(
            attn, self.num_heads, self.num_kv_heads, self.head_dim
        )
        self.group = self.num_heads // self.num_kv_heads
        self.scaling = getattr(attn, "scaling", None) or self.head_dim**-0.5
        self.softcap = getattr(config, "attn_logit_softcapping", None)  # Gemma 2: tanh-capped logits
        self.window = sliding_windows(config, config.num_hidden_layers)[layer_idx]
        # the teacher's norms of q and k after their projections (None where the family has none)
        self.q_norm, self.k_norm = getattr(attn, "q_norm", None), getattr(attn, "k_norm", None)
        self.state_size = int(state_size)
        self.ssm_heads = sorted(int(h) for h in ssm_heads)
        bad = [h for h in self.ssm_heads if not 0 <= h < self.num_heads]
        if bad:
            raise ValueError(f"layer {layer_idx}: heads {bad} out of range 0..{self.num_heads - 1}")
        self.swapped: set[int] = set()  # SSM heads temporarily run as attention (layer swap)
        self.capture = False  # keep the last forward's per-head maps in `captured` (captured_maps)
        self.first_token_share = True  # False: no share of the first token (the recipe ablation)
        self.captured = None
        d, n, p, s = config.hidden_size, self.state_size, self.head_dim, len(self.ssm_heads)
        bias = self.q_proj.bias is not None
        on = {"device": self.q_proj.weight.device}  # beside the teacher's weights (CPU or GPU)
        with warnings.catch_warnings():  # a layer that keeps all its heads has zero-size SSM blocks
            warnings.filterwarnings("ignore", "Initializing zero-element tensors")
            self.C_proj = nn.Linear(d, s * n, bias=bias, **on)
            self.B_proj = nn.Linear(d, s * n, bias=bias, **on)
            self.x_proj = nn.Linear(d, s * p, bias=bias, **on)
            self.decay_proj = nn.Linear(d, s, bias=True, **on)
            self.sink_proj = nn.Linear(d, s, bias=True, **on)
        self.D = nn.Parameter(torch.zeros(s, **on))
        self.local = nn.Parameter(torch.zeros(s, LOCAL_WIDTH, **on))  # the local skip's weights
        self.norm_weight = nn.Parameter(torch.ones(s, p, **on))
        self.init_from_attention()

    @torch.no_grad()
    def init_from_attention(self, seed: int = 0):
        n, p = self.state_size, self.head_dim
        gen = torch.Generator(device="cpu").manual_seed(seed * 1000 + self.layer_idx)
        # the q/k norms' gains (their division by the RMS is not linear), read once per layer
        q_gain, k_gain = (None if norm is None else norm_gain(norm) for norm in (self.q_norm, self.k_norm))
        for j, h in enumerate(self.ssm_heads):
            g = h // self.group
            # C also carries 1/sqrt(P) like attention logits, and a small factor: without softmax's
            # normalisation a sum over many positions would otherwise start far too large
            c_scale = self.scaling * C_INIT_SCALE
            pairs = (
                (self.C_proj, self.q_proj, q_gain, h, c_scale),
                (self.B_proj, self.k_proj, k_gain, g, 1.0),
            )
            for dst, src, gain, rows, scale in pairs:
                block = src.weight[rows * p : (rows + 1) * p]
                if gain is not None:  # per head (Qwen3, Gemma 3) or over the whole projection (OLMo-2)
                    block = block * (gain if gain.numel() == p else gain[rows * p : (rows + 1) * p])[:, None]
                take = min(n, p)
                w = dst.weight[j * n : (j + 1) * n]
                w[:take] = block[:take] * scale
                if n > p:  # extra state dimensions start small and random
                    # drawn on the CPU, so a seed gives the same student on any device
                    noise = torch.randn(n - take, w.shape[1], generator=gen, device="cpu").to(w.device)
                    w[take:] = noise * block.std() * 0.1
                if dst.bias is not None:
                    dst.bias[j * n : j * n + take] = src.bias[rows * p : rows * p + take] * scale
                    dst.bias[j * n + take : (j + 1) * n] = 0
            self.x_proj.weight[j * p : (j + 1) * p] = self.v_proj.weight[g * p : (g + 1) * p]
            if self.x_proj.bias is not None:
                self.x_proj.bias[j * p : (j + 1) * p] = self.v_proj.bias[g * p : (g + 1) * p]
        # per-step decays exp(-dt), dt log-spaced in [0.001, 0.1] across heads (Mamba's init)
        s = len(self.ssm_heads)
        dt = torch.exp(torch.linspace(math.log(1e-3), math.log(1e-1), max(s, 1), device=self.D.device))[:s]
        self.decay_proj.weight.zero_()
        self.decay_proj.bias.copy_(torch.log(torch.expm1(dt)))  # softplus⁻¹
        self.D.zero_()
        self.local.zero_()
        # the first token's share starts at SINK_INIT (fitted from the teacher's maps when aligning)
        self.sink_proj.weight.zero_()
        self.sink_proj.bias.fill_(math.log(SINK_INIT / (1 - SINK_INIT)))

    # -- which heads run how ------------------------------------------------------------------
    @property
    def attention_heads(self) -> list[int]:
        ssm = set(self.ssm_heads) - self.swapped
        return [h for h in range(self.num_heads) if h not in ssm]

    @property
    def active_ssm(self) -> list[int]:
        """Positions j (into the SSM parameter blocks) of the SSM heads that run as SSM."""
        return [j for j, h in enumerate(self.ssm_heads) if h not in self.swapped]

    def ssm_state(self) -> dict[str, nn.Parameter]:
        """The SSM parameters by name (the only parameters distillation trains); each holds one
        block of rows per SSM head, in `ssm_heads` order (norm_weight: one row per head)."""
        named = {
            "C_proj.weight": self.C_proj.weight,
            "B_proj.weight": self.B_proj.weight,
            "x_proj.weight": self.x_proj.weight,
            "decay_proj.weight": self.decay_proj.weight,
            "decay_proj.bias": self.decay_proj.bias,
            "D": self.D,
            "local": self.local,
            "norm_weight": self.norm_weight,
            "sink_proj.weight": self.sink_proj.weight,
            "sink_proj.bias": self.sink_proj.bias,
        }
        for key in ("C_proj", "B_proj", "x_proj"):
            bias = getattr(self, key).bias
            if bias is not None:
                named[f"{key}.bias"] = bias
        return named

    @property
    def ssm_projections(self) -> list[nn.Linear]:
        """The SSM heads' five projections of the layer input (x, B, C, decay, first-token share),
        in the order ssm_inputs multiplies them as one matmul."""
        return [self.x_proj, self.B_proj, self.C_proj, self.decay_proj, self.sink_proj]

    def ssm_params(self) -> list[nn.Parameter]:
        """The trainable SSM parameters (without the first-token share's when it is switched off)."""
        return [v for k, v in self.ssm_state().items() if self.first_token_share or not k.startswith("sink_proj")]

    # -- the two head kinds ------------------------------------------------------------------
    def _heads_of(self, proj, norm, u, n: int):
        """proj(u) as [B, L, n, P] after the teacher's norm of it: over the whole projection
        (OLMo-2) before the split into heads, per head (Qwen3) after it."""
        b, length, _ = u.shape
        # each projection casts u to the teacher's dtype on its own (alignment passes float32
        # states to a bf16 teacher), as autocast does: their gradients then add up in float32
        y = proj(u.to(proj.weight.dtype))
        per_head = norm is not None and norm.weight.numel() == self.head_dim
        if norm is not None and not per_head:
            y = norm(y)
        y = y.view(b, length, n, self.head_dim)
        return norm(y) if per_head else y

    def _qkv(self, u, position_embeddings, heads: list[int]):
        q = self._heads_of(self.q_proj, self.q_norm, u, self.num_heads)[:, :, heads].transpose(1, 2)
        k = self._heads_of(self.k_proj, self.k_norm, u, self.num_kv_heads).transpose(1, 2)
        v = self._heads_of(self.v_proj, None, u, self.num_kv_heads).transpose(1, 2)
        # rotated in the rotary tables' precision, as the teacher's own attention does, then in
        # v's dtype for the attention itself (what autocast does too; a bf16 teacher needs it)
        return _rope(q, position_embeddings).to(v.dtype), _rope(k, position_embeddings).to(v.dtype), v

    def kept_mask(self, allowed, u, causal_as_none: bool = False):
        """The [B, 1, L, L] bool visibility of the kept heads for the sequence layout `allowed`
        (None: causal): the layout, narrowed to the teacher's sliding window where the layer has
        one. causal_as_none: None where that is plain causal attention (scaled_dot_product's
        is_causal, faster than a mask)."""
        length = u.shape[1]
        if self.window is None or length <= self.window:  # no position is a window away
            if allowed is None and causal_as_none:
                return None
            return self.structure(allowed, u)[:, None]
        return windowed(self.structure(allowed, u), self.window)[:, None]

    def _logits(self, q, k):
        """Attention logits [B, H, Lq, Lk] (soft-capped where the teacher caps them)."""
        scores = torch.einsum("bhlp,bhsp->bhls", q, k) * self.scaling
        return scores if self.softcap is None else torch.tanh(scores / self.softcap) * self.softcap

    def _attend(self, q, k, v, mask, causal: bool):
        """Softmax attention [B, H, Lq, P]; mask: bool [B, 1 or H, Lq, Lk] or None (then
        `causal` or every key visible). Soft-capped logits have no fused kernel: the eager path,
        as the teacher's own (Gemma 2)."""
        if self.softcap is None:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=self.scaling)
        scores = self._logits(q, k)
        if mask is None and causal:
            mask = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device=q.device).tril(k.shape[2] - q.shape[2])
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        return torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype) @ v

    def attention_output(
        self, u, position_embeddings, allowed, heads: list[int], return_kv: bool = False, per_head=None
    ):
        """Softmax attention of query `heads` with the teacher's weights: [B, L, len(heads), P].
        allowed: the sequence layout (None: causal); per_head: optional [B, len(heads), L, L] bool
        mask replacing it head by head (already narrowed to any window, as the engine's masks are)."""
        q, k, v = self._qkv(u, position_embeddings, heads)
        groups = [h // self.group for h in heads]
        mask = per_head if per_head is not None else self.kept_mask(allowed, u, causal_as_none=True)
        out = self._attend(q, k[:, groups], v[:, groups], mask, causal=mask is None).transpose(1, 2)
        return (out, k, v) if return_kv else out

    def attention_probs(self, u, position_embeddings, heads: list[int], visible):
        """[B, len(heads), L, L] softmax attention probabilities of query `heads` with the
        teacher's weights; visible: bool mask broadcastable to that shape (l may read s; for the
        teacher's own visibility, kept_mask)."""
        q, k, _ = self._qkv(u, position_embeddings, heads)
        scores = self._logits(q, k[:, [h // self.group for h in heads]])
        return torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1)

    def ssm_dtype(self, u):
        """`u` in the SSM parameters' dtype: they stay float32 (they are trained) under a bf16 or
        fp16 teacher, whose hidden states are promoted here; forward casts the heads back."""
        return u.to(self.x_proj.weight.dtype)

    def ssm_inputs(self, u, which: list[int] | None = None):
        """(x [B, L, S, P], log_a [B, L, S], B [B, L, S, N], C [B, L, S, N], share [B, L, S]) for
        SSM heads `which`; share: the first token's share of each head's output (with_first_token;
        zero where first_token_share is off). The five projections of u are one matmul
        (linear_group)."""
        b, length, _ = u.shape
        s, n, p = len(self.ssm_heads), self.state_size, self.head_dim
        x, Bm, Cm, decay, sink = linear_group(self.ssm_projections, self.ssm_dtype(u))
        x, Bm, Cm = x.reshape(b, length, s, p), Bm.reshape(b, length, s, n), Cm.reshape(b, length, s, n)
        log_a = -F.softplus(decay)
        share = torch.sigmoid(sink) if self.first_token_share else torch.zeros_like(sink)
        if which is not None and len(which) != s:
            x, Bm, Cm = x[:, :, which], Bm[:, :, which], Cm[:, :, which]
            log_a, share = log_a[:, :, which], share[:, :, which]
        return x, log_a, Bm, Cm, share

    def ssm_output(
        self,
        u,
        allowed,
        which: list[int] | None = None,
        chunk: int = 128,
        restrict=None,
        layout: TreeLayout | None = None,
    ):
        """SSM heads `which`: [B, L, len(which), P]. restrict: optional [B, len(which), L, L] bool
        mask applied to each head's materialised matrix (the head's output is recomputed from the
        masked matrix; the decays still follow the sequence layout `allowed`). layout: `allowed`'s
        tree_layout (forward finds it once per batch, layout_of) for the fast path; None where it
        has none: the materialised matrix."""
        x, log_a, Bm, Cm, share = self.ssm_inputs(u, which)
        D = self.D if which is None else self.D[which]
        local = self.local if which is None else self.local[which]
        # where T is materialised anyway, the local skip is too (the same operations whether or
        # not a restriction applies, so an all-visible restriction changes nothing, bit for bit)
        if restrict is not None or (allowed is not None and layout is None):
            structure = self.structure(allowed, u)
            T, T_local = materialize(log_a, Bm, Cm, D, structure), local_matrix(local, structure, u.shape[1])
            if restrict is not None:
                T, T_local = T * restrict, T_local * restrict
            y = torch.einsum("bhls,bshp->blhp", T, x) + torch.einsum("bhls,bshp->blhp", T_local, x)
        elif allowed is None:
            y = ssd_scan(ScanInputs(x, log_a, Bm, Cm, D), chunk)[0]
            y = y + local_mix_causal(x, local)
        else:  # the fast path of the materialised one
            y = ssd_tree(ScanInputs(x, log_a, Bm, Cm, D), layout, chunk)
            y = y + local_mix(x, local, *layout.predecessors(local.shape[1]))
        if restrict is not None:  # a row that may not read the first token gets nothing from it
            share = share * restrict[..., 0].transpose(1, 2)
        first = self.first_value(u, which)
        return self.with_first_token(self.normalize(y, which), share, first, first_position=True)

    @staticmethod
    def structure(allowed, u):
        """[B, L, L] bool visibility of the sequence layout (`allowed`, or causal where None)."""
        b, length = u.shape[:2]
        if allowed is not None:
            return allowed.expand(b, length, length)
        return torch.ones(length, length, dtype=torch.bool, device=u.device).tril()[None].expand(b, -1, -1)

    # -- the first token: attention sinks -------------------------------------------------------
    def first_value(self, u, which: list[int] | None = None):
        """[B, 1, len(which), P]: the value of the first token for each SSM head (its K/V group's
        v_proj), what the teacher's head reads when it attends to the first token."""
        heads = self.ssm_heads if which is None else [self.ssm_heads[j] for j in which]
        b, p = u.shape[0], self.head_dim
        v = self.v_proj(u[:, :1].to(self.v_proj.weight.dtype)).view(b, 1, self.num_kv_heads, p)
        return v[:, :, [h // self.group for h in heads]]

    @staticmethod
    def with_first_token(y, share, first, first_position: bool):
        """Mix the first token's value into the scan output y by `share`; at the first position
        itself the output is that value exactly, as softmax attention over one token gives.
        Teacher heads park much of their attention on the first token (a sink) whose value a
        decaying scan cannot hold over long spans."""
        out = (1 - share[..., None]) * y + share[..., None] * first
        if first_position:
            out = torch.cat([first.expand(-1, 1, -1, -1), out[:, 1:]], dim=1)
        return out

    def head_maps(self, u, position_embeddings, allowed, per_head=None):
        """[B, H, L, L] per-head maps: attention probabilities for attention heads; for SSM heads
        the implicit attention |T| normalised per row (T before the head norm, with the skip
        term) and scaled by 1 − the first token's share, which is added on the first column, so
        both read as 'share of the row's weight on each position'."""
        b, length, _ = u.shape
        maps = u.new_zeros(b, self.num_heads, length, length)
        structure = self.structure(allowed, u)
        attn = self.attention_heads
        if attn:
            mask = per_head[:, attn] if per_head is not None else self.kept_mask(allowed, u)
            maps[:, attn] = self.attention_probs(u, position_embeddings, attn, mask)
        active = self.active_ssm
        if active:
            heads = [self.ssm_heads[j] for j in active]
            x, log_a, Bm, Cm, share = self.ssm_inputs(u, active)
            T = (
                materialize(log_a, Bm, Cm, self.D[active], structure)
                + local_matrix(self.local[active], structure, length)
            ).abs()  # the local skip is part of the mix
            share = share.transpose(1, 2)  # [B, S, L]
            if per_head is not None:
                T = T * per_head[:, heads]
                share = share * per_head[:, heads, :, 0]
            T = (1 - share[..., None]) * T / T.sum(-1, keepdim=True).clamp_min(1e-12)
            T[..., 0] += share
            T[:, :, 0] = 0
            T[:, :, 0, 0] = 1  # the first position reads the first token only
            maps[:, heads] = T
        return maps

    def normalize(self, y, which=None):
        """Per-head RMS norm of the scan output (as Mamba-2 before out_proj): softmax attention
        outputs are averages of values, a linear scan's are sums, so their scale varies with
        length; the norm removes that and its weight (fitted) sets the head's output scale."""
        w = self.norm_weight if which is None else self.norm_weight[which]
        return y * torch.rsqrt(y.square().mean(-1, keepdim=True) + 1e-6) * w

    def forward(self, hidden_states, position_embeddings=None, attention_mask=None, **kwargs):
        b, length, _ = hidden_states.shape
        allowed, per_head = _visibility(attention_mask, b, length)
        if self.window is not None and allowed is not None and length > self.window:
            # a windowed layer's mask: the layout beneath it (the SSM heads' and the kept heads')
            allowed = derived_from(attention_mask, "layout beneath a window", lambda: unwindowed(allowed))
        heads = hidden_states.new_zeros(b, length, self.num_heads, self.head_dim, dtype=_matmul_dtype(hidden_states))
        attn = self.attention_heads
        if attn:
            heads[:, :, attn] = self.attention_output(
                hidden_states,
                position_embeddings,
                allowed,
                attn,
                per_head=None if per_head is None else per_head[:, attn],
            ).to(heads.dtype)  # bf16 under autocast
        active = self.active_ssm
        if active:
            ssm = [self.ssm_heads[j] for j in active]
            restrict = None if per_head is None else per_head[:, ssm]
            if restrict is not None and bool((restrict == allowed[:, None]).all()):
                restrict = None  # per-head masks that leave the SSM heads the whole layout (masking other heads)
            layout = layout_of(attention_mask, allowed) if allowed is not None and restrict is None else None
            heads[:, :, ssm] = self.ssm_output(hidden_states, allowed, active, restrict=restrict, layout=layout).to(
                heads.dtype
            )
        if self.capture:
            self.captured = self.head_maps(hidden_states, position_embeddings, allowed, per_head)
        return self.o_proj(heads.reshape(b, length, -1)), None

    # -- recurrent inference (cache = K/V of the used groups + SSM states) ----------------------
    def prefill(self, u, position_embeddings):
        b, length, _ = u.shape
        heads = u.new_zeros(b, length, self.num_heads, self.head_dim)
        cache = {}
        attn = self.attention_heads
        if attn:
            out, k, v = self.attention_output(u, position_embeddings, None, attn, return_kv=True)
            heads[:, :, attn] = out
            groups = sorted({h // self.group for h in attn})
            cache["k"], cache["v"], cache["groups"] = self.in_window(k[:, groups]), self.in_window(v[:, groups]), groups
        active = self.active_ssm
        if active:
            x, log_a, Bm, Cm, share = self.ssm_inputs(u, active)
            y, state = ssd_scan(ScanInputs(x, log_a, Bm, Cm, self.D[active]))
            local = self.local[active]
            y = y + local_mix_causal(x, local)
            first = self.first_value(u, active)
            heads[:, :, [self.ssm_heads[j] for j in active]] = self.with_first_token(
                self.normalize(y, active), share, first, first_position=True
            ).to(heads.dtype)
            # the last LOCAL_WIDTH values, oldest first (zeros before the first token)
            recent = torch.cat([x.new_zeros(b, local.shape[1], *x.shape[2:]), x], dim=1)[:, -local.shape[1] :]
            cache["state"], cache["first"], cache["recent"] = state, first, recent
        return self.o_proj(heads.reshape(b, length, -1)), cache

    def in_window(self, kv):
        """The cached keys or values [B, groups, T, P] a windowed layer still needs: the last
        `window` (the next token sees itself and window − 1 before it)."""
        return kv if self.window is None else kv[:, :, -self.window :]

    def step(self, u, position_embeddings, cache):
        """One new token u [B, 1, d]; updates `cache` in place."""
        b = u.shape[0]
        p = self.head_dim
        heads = u.new_zeros(b, 1, self.num_heads, p)
        attn = self.attention_heads
        if attn:
            q = self._heads_of(self.q_proj, self.q_norm, u, self.num_heads)[:, :, attn].transpose(1, 2)
            q = _rope(q, position_embeddings)
            k = _rope(
                self._heads_of(self.k_proj, self.k_norm, u, self.num_kv_heads).transpose(1, 2), position_embeddings
            )
            v = self._heads_of(self.v_proj, None, u, self.num_kv_heads).transpose(1, 2)
            groups = cache["groups"]
            cache["k"] = self.in_window(torch.cat([cache["k"], k[:, groups]], dim=2))
            cache["v"] = self.in_window(torch.cat([cache["v"], v[:, groups]], dim=2))
            slot = [groups.index(h // self.group) for h in attn]
            out = self._attend(q.to(v.dtype), cache["k"][:, slot], cache["v"][:, slot], None, causal=False)
            heads[:, :, attn] = out.transpose(1, 2)
        active = self.active_ssm
        if active:
            x, log_a, Bm, Cm, share = self.ssm_inputs(u, active)
            y, cache["state"] = ssd_recurrent(x, log_a, Bm, Cm, self.D[active], cache["state"])
            recent, local = cache["recent"], self.local[active]
            y = y + sum(
                local[:, j - 1][None, None, :, None] * recent[:, -j : recent.shape[1] - j + 1]
                for j in range(1, local.shape[1] + 1)
            )
            cache["recent"] = torch.cat([recent[:, 1:], x], dim=1)
            heads[:, :, [self.ssm_heads[j] for j in active]] = self.with_first_token(
                self.normalize(y, active), share, cache["first"], first_position=False
            ).to(heads.dtype)
        return self.o_proj(heads.reshape(b, 1, -1))


# -- the mixers of a model ----------------------------------------------------------------


ATTENTION_NAMES = ("self_attn", "attention", "attn")  # a decoder layer's attention (GPT-NeoX, GPT-2)


def attention_name(layer) -> str | None:
    """The name of a decoder layer's attention module (None where it has none)."""
    return next((name for name in ATTENTION_NAMES if isinstance(getattr(layer, name, None), nn.Module)), None)


def mixer_of(layer):
    """A decoder layer's attention module (its HybridMixer in a student)."""
    return getattr(layer, attention_name(layer))


def mixer_input(layer, hidden: torch.Tensor) -> torch.Tensor:
    """What a decoder layer's attention (its mixer) reads from the hidden state entering it: the
    state after the layer's input norm (pre-norm layers: Llama, Qwen, Gemma; GPT-2's ln_1), the
    state itself in post-norm layers (OLMo-2, whose norms follow attention and MLP)."""
    norm = getattr(layer, "input_layernorm", None) or getattr(layer, "ln_1", None)
    return hidden if norm is None else norm(hidden)


def layer_forward(layer, hidden: torch.Tensor, attend) -> torch.Tensor:
    """The decoder layer's residual step around `attend` (the mixer's output for mixer_input).
    Llama's post_attention_layernorm (GPT-2's ln_2) is the MLP's input norm, read after the
    attention's residual or, in parallel-residual layers (GPT-NeoX), from the same input; in
    layers with a post_feedforward_layernorm it is the norm of the attention's output instead,
    and the MLP reads the state through pre_feedforward_layernorm where there is one (Gemma's four
    norms) or directly (OLMo-2)."""
    if getattr(layer, "post_feedforward_layernorm", None) is None:
        mlp_norm = getattr(layer, "post_attention_layernorm", None) or layer.ln_2
        attended = attend(mixer_input(layer, hidden))
        if getattr(layer, "use_parallel_residual", False):
            return hidden + attended + layer.mlp(mlp_norm(hidden))
        hidden = hidden + attended
        return hidden + layer.mlp(mlp_norm(hidden))
    hidden = hidden + layer.post_attention_layernorm(attend(mixer_input(layer, hidden)))
    pre = getattr(layer, "pre_feedforward_layernorm", None)
    return hidden + layer.post_feedforward_layernorm(layer.mlp(hidden if pre is None else pre(hidden)))


def rotary(base, hidden: torch.Tensor, positions: torch.Tensor, layer_idx: int):
    """The rotary tables (cos, sin) that layer `layer_idx` of the decoder `base` reads at
    `positions`: per layer type where the family has several (Gemma 3: local and global)."""
    if getattr(base, "rotary_emb", None) is None:  # learned positions (GPT-2)
        return None
    types = getattr(base.config, "layer_types", None)
    if types is not None and "layer_type" in inspect.signature(base.rotary_emb.forward).parameters:
        return base.rotary_emb(hidden, positions, types[layer_idx])
    return base.rotary_emb(hidden, position_ids=positions)


def layers_of(model):
    from gna.engine.anatomy import decoder_layers

    return decoder_layers(model)


def mixers(model) -> list[HybridMixer]:
    """The HybridMixers of a student, in layer order (none in any other model)."""
    found = (getattr(layer, name) for layer in layers_of(model) if (name := attention_name(layer)))
    return [m for m in found if isinstance(m, HybridMixer)]


def ssm_heads_of(model) -> set[tuple[int, int]]:
    """(layer, head) of every head that runs as an SSM head now (swapped heads excluded)."""
    return {(m.layer_idx, h) for m in mixers(model) for h in m.ssm_heads if h not in m.swapped}


@contextlib.contextmanager
def swapped_to_attention(model, layers: list[int]):
    """Temporarily run every head of `layers` as the teacher's attention (the layer swap)."""
    ms = {m.layer_idx: m for m in mixers(model)}
    try:
        for i in layers:
            ms[i].swapped = set(ms[i].ssm_heads)
        yield model
    finally:
        for i in layers:
            ms[i].swapped = set()


@contextlib.contextmanager
def captured_maps(model):
    """Within the block, each forward of a hybrid leaves [layers] of [B, H, L, L] head maps in
    the yielded list (attention probabilities / normalised implicit attention)."""
    ms = mixers(model)
    out: list = []
    for m in ms:
        m.capture = True
    try:
        yield out
    finally:
        out.extend(m.captured for m in ms)
        for m in ms:
            m.capture, m.captured = False, None


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
