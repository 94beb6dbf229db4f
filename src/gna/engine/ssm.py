"""A discrete Mamba-2 style selective state-space scan (the SSD form), in plain torch.

Per head, with input x_t ∈ R^P, state-space vectors B_t, C_t ∈ R^N, a scalar decay
a_t = exp(log_a_t) ∈ (0, 1] and a skip weight D:

    S_t = a_t · S_{t-1} + B_t ⊗ x_t          (state S ∈ R^{N×P})
    y_t = C_t · S_t + D · x_t

Unrolled, y = T x with the head's implicit attention matrix

    T[l, s] = (C_l · B_s) · exp(cum[l] − cum[s])  for s ≤ l   (cum = cumsum of log_a)
              + D on the diagonal.

Three ways to compute it, kept equal by tests:
  ssd_recurrent     the recurrence above, one step at a time (the slow reference)
  ssd_chunked       the chunked scan: quadratic inside chunks, states passed between them
                    (the fast path for training and long sequences)
  materialize       T itself (for maps and masking); `ssd_masked` applies T under any
                    tree-shaped visibility mask, e.g. the packed multiple-choice layout of
                    gna.engine.packing where each choice sees the context and itself only.
`ssd_padded` is the fast path of `ssd_masked` for right-padded causal batches (the packed
layout of items whose choices are single tokens: KV retrieval, MMLU letters): the chunked
scan, with the padding rows, which see only themselves, computed as such.

The local skip generalises D to the last few tokens: y_l += sum_j w_j x_{l-j} for j = 1..W (a
short causal convolution beside the scan, as Mamba's conv1d gives an SSM layer direct access to
the last tokens). `local_mix` computes it by gathering each position's predecessors on its own
path (`path_predecessors`; packed choices never read each other); `local_matrix` is the same
term as a matrix, added to T wherever T itself is needed (maps, masking). Tests keep them equal.

Shapes: x [B, L, H, P], log_a [B, L, H] (≤ 0), Bm / Cm [B, L, H, N], D [H].
"""

from __future__ import annotations

import torch


def ssd_recurrent(x, log_a, Bm, Cm, D, state=None):
    """Reference recurrence. Returns (y [B, L, H, P], final state [B, H, N, P])."""
    b, length, h, p = x.shape
    n = Bm.shape[-1]
    S = x.new_zeros(b, h, n, p) if state is None else state
    ys = []
    for t in range(length):
        S = torch.exp(log_a[:, t])[:, :, None, None] * S + Bm[:, t, :, :, None] * x[:, t, :, None, :]
        ys.append(torch.einsum("bhn,bhnp->bhp", Cm[:, t], S) + D[None, :, None] * x[:, t])
    return torch.stack(ys, dim=1), S


def _segsum(log_a):
    """[..., L] → [..., L, L] with out[l, s] = sum(log_a[s+1..l]) for s ≤ l, −inf above."""
    length = log_a.shape[-1]
    cum = torch.cumsum(log_a, dim=-1)
    seg = cum[..., :, None] - cum[..., None, :]
    causal = torch.ones(length, length, dtype=torch.bool, device=log_a.device).tril()
    return seg.masked_fill(~causal, float("-inf"))


def materialize(log_a, Bm, Cm, D, allowed=None):
    """Implicit attention matrices T [B, H, L, L] (row = output position l, column = s).

    allowed: optional [B, L, L] bool visibility (l may read s). It must be tree-shaped — every
    position visible to l is visible along one path ending at l, as with causal and packed
    block masks — so the decay from s to l sums log_a over the positions l sees after s."""
    scores = torch.einsum("blhn,bshn->bhls", Cm, Bm)
    la = log_a.transpose(1, 2)  # [B, H, L]
    if allowed is None:
        decay = torch.exp(_segsum(la))
    else:
        vis = allowed[:, None].to(la.dtype)  # [B, 1, L, L]
        cum = torch.einsum("bxls,bhs->bhl", vis, la)  # log_a summed along l's own path
        seg = (cum[..., :, None] - cum[..., None, :]).masked_fill(~allowed[:, None], float("-inf"))
        decay = torch.exp(seg)
    eye = torch.eye(log_a.shape[1], dtype=scores.dtype, device=scores.device)
    return scores * decay + D[None, :, None, None] * eye


def ssd_masked(x, log_a, Bm, Cm, D, allowed=None):
    """y = T x with T from `materialize` (quadratic; exact for packed sequences)."""
    T = materialize(log_a, Bm, Cm, D, allowed)
    return torch.einsum("bhls,bshp->blhp", T, x)


def padded_lengths(allowed) -> torch.Tensor | None:
    """[B] the number of leading rows of each sequence that see exactly their causal prefix,
    when every later row sees only itself (right padding in gna.engine.packing's layout); None
    for any other visibility (e.g. several choices packed after one context)."""
    length = allowed.shape[-1]
    causal = torch.ones(length, length, dtype=torch.bool, device=allowed.device).tril()
    eye = torch.eye(length, dtype=torch.bool, device=allowed.device)
    row_causal = (allowed == causal).all(-1)  # [B, L]
    row_self = (allowed == eye).all(-1)
    lengths = row_causal.long().cumprod(-1).sum(-1)
    tail = torch.arange(length, device=allowed.device)[None] >= lengths[:, None]
    return lengths if bool((row_self | ~tail).all()) else None


def ssd_padded(x, log_a, Bm, Cm, D, lengths, chunk: int = 64):
    """ssd_masked under the layout `padded_lengths` found: rows below `lengths` [B] by the
    chunked scan (padding comes after them, so it cannot reach them), later rows from
    themselves only (T[l, l] x_l)."""
    y = ssd_chunked(x, log_a, Bm, Cm, D, chunk)[0]
    pad = torch.arange(x.shape[1], device=x.device)[None] >= lengths[:, None]  # [B, L]
    if not bool(pad.any()):
        return y
    self_only = ((Cm * Bm).sum(-1) + D)[..., None] * x  # [B, L, H, P]
    return torch.where(pad[:, :, None, None], self_only, y)


def ssd_chunked(x, log_a, Bm, Cm, D, chunk: int = 64, state=None):
    """Chunked scan. Returns (y [B, L, H, P], final state [B, H, N, P])."""
    b, length, h, p = x.shape
    n = Bm.shape[-1]
    S = x.new_zeros(b, h, n, p) if state is None else state
    ys = []
    for start in range(0, length, chunk):
        sl = slice(start, min(start + chunk, length))
        xc, lac, Bc, Cc = x[:, sl], log_a[:, sl].transpose(1, 2), Bm[:, sl], Cm[:, sl]  # lac [B, H, Q]
        cum = torch.cumsum(lac, dim=-1)  # decay from the chunk start, inclusive
        # inside the chunk: quadratic, causal
        intra = torch.einsum("blhn,bshn->bhls", Cc, Bc) * torch.exp(_segsum(lac))
        y = torch.einsum("bhls,bshp->blhp", intra, xc)
        # from the state entering the chunk
        y = y + torch.einsum("blhn,bhnp->blhp", Cc * torch.exp(cum).transpose(1, 2)[..., None], S)
        ys.append(y + D[None, None, :, None] * xc)
        # state leaving the chunk
        to_end = torch.exp(cum[..., -1:] - cum).transpose(1, 2)  # [B, Q, H]
        S = torch.exp(cum[..., -1])[..., None, None] * S + torch.einsum("bshn,bsh,bshp->bhnp", Bc, to_end, xc)
    return torch.cat(ys, dim=1), S


# -- the local skip -------------------------------------------------------------------------

def path_predecessors(allowed, length: int, width: int, device=None):
    """(index, exists), each [B or 1, L, width]: the j-th position before l on l's own path
    (j = 1..width: the positions l may read, newest first) and whether there is one.
    allowed: [B, L, L] tree-shaped bool visibility, or None for plain causal order."""
    if allowed is None:
        pos = torch.arange(length, device=device)[:, None] - torch.arange(1, width + 1, device=device)[None]
        return pos.clamp_min(0)[None], (pos >= 0)[None]
    rank = _path_rank(allowed)
    steps = torch.arange(1, width + 1, device=allowed.device)
    hit = allowed[..., None] & (rank[..., None] == steps)  # [B, L, L, width]
    index = (hit.long() * torch.arange(length, device=allowed.device)[None, None, :, None]).sum(2)
    return index, hit.any(2)


def _path_rank(allowed):
    """[B, L, L] long: for each visible (l, s), how many visible positions lie after s up to and
    including l (0 on the diagonal)."""
    return allowed.flip(-1).long().cumsum(-1).flip(-1) - 1


def local_mix(x, weights, index, exists):
    """The local skip sum_j weights[h, j-1] * x[b, pred_j(l), h] (index/exists from
    path_predecessors): x [B, L, H, P], weights [H, W] -> [B, L, H, P]."""
    b, length, h, p = x.shape
    index, exists = index.expand(b, -1, -1), exists.expand(b, -1, -1)
    out = torch.zeros_like(x)
    for j in range(weights.shape[1]):
        picked = torch.gather(x, 1, index[:, :, j, None, None].expand(b, length, h, p))
        out = out + picked * (weights[:, j][None, None, :, None] * exists[:, :, j, None, None].to(x.dtype))
    return out


def local_matrix(weights, allowed, length: int):
    """[B or 1, H, L, L]: the local skip as a matrix (row l, column s), to add to `materialize`'s
    T; weights [H, W]; allowed as for path_predecessors (None: causal)."""
    if allowed is None:
        allowed = torch.ones(length, length, dtype=torch.bool, device=weights.device).tril()[None]
    rank = _path_rank(allowed)  # [B, L, L]
    out = weights.new_zeros(allowed.shape[0], weights.shape[0], length, length)
    for j in range(weights.shape[1]):
        out = out + (allowed & (rank == j + 1))[:, None].to(weights.dtype) * weights[:, j][None, :, None, None]
    return out
