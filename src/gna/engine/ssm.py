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
                    (the fast path for training and long sequences; on a GPU with mamba-ssm,
                    its Triton kernel runs instead: ssd_scan, gna.engine.ssm_kernel)
  materialize       T itself (for maps and masking); `ssd_masked` applies T under any
                    tree-shaped visibility mask, e.g. the packed multiple-choice layout of
                    gna.engine.packing where each choice sees the context and itself only.
`ssd_tree` is the fast path of `ssd_masked` for scoring batches (`tree_layout`: right padding,
choices packed after their context): the chunked scan over each sequence's causal trunk, then a
short recurrence for the rows after it, from the trunk's state; padding rows see only themselves.

The local skip generalises D to the last few tokens: y_l += sum_j w_j x_{l-j} for j = 1..W (a
short causal convolution beside the scan, as Mamba's conv1d gives an SSM layer direct access to
the last tokens). `local_mix` computes it by gathering each position's predecessors on its own
path (`causal_predecessors`, `TreeLayout.predecessors`; packed choices never read each other;
`local_mix_causal` is its fast path in plain causal order); `local_matrix` is the same
term as a matrix, added to T wherever T itself is needed (maps, masking). Tests keep them equal.

Shapes: x [B, L, H, P], log_a [B, L, H] (≤ 0), Bm / Cm [B, L, H, N], D [H]. The chunked scans
(ssd_chunked, ssd_scan, ssd_tree and the kernel's ssd_chunked_kernel) take the five as one
ScanInputs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from gna.engine import ssm_kernel  # imports triton and mamba-ssm only when the kernel is first used


class ScanInputs(NamedTuple):
    """The five inputs of a scan (shapes above): x [B, L, H, P], log_a [B, L, H] (≤ 0),
    B and C [B, L, H, N] (the state-space vectors, Bm and Cm elsewhere), D [H] (the skip)."""

    x: torch.Tensor
    log_a: torch.Tensor
    B: torch.Tensor
    C: torch.Tensor
    D: torch.Tensor


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


@dataclass
class TreeLayout:
    """A tree-shaped visibility (gna.engine.packing's layout) in the form the fast scan needs:
    each row's state is its parent's, decayed, plus its own input, so the chunked scan over the
    whole batch is exact on each sequence's causal trunk and only the rows after it (packed
    choices) need their own short recurrence from the trunk's state.

    parent  [B, L] long: the last position before l that l sees (its predecessor on its own
            path), −1 where there is none (the first token, padding rows)
    trunk   [B] long: the leading rows that see exactly their causal prefix
    self_only [B, L] bool: rows after the trunk that see only themselves (padding)
    levels  per depth after the trunk, (batch index, position) of the rows at that depth: depth
            1 rows have their parent in the trunk, depth d + 1 rows at depth d"""

    parent: torch.Tensor
    trunk: torch.Tensor
    self_only: torch.Tensor
    levels: list[tuple[torch.Tensor, torch.Tensor]]

    def predecessors(self, width: int):
        """(index, exists), each [B, L, width]: the j-th position before l on l's own path
        (j = 1..width, newest first), as `local_mix` takes them."""
        steps, current = [], self.parent
        for _ in range(width):
            steps.append(current)
            current = torch.where(current >= 0, torch.gather(self.parent, 1, current.clamp_min(0)), current)
        index = torch.stack(steps, -1)
        return index.clamp_min(0), index >= 0


def tree_layout(allowed) -> TreeLayout | None:
    """The TreeLayout of a [B, L, L] bool visibility (l may read s), or None where it is not
    tree-shaped the way the fast scan needs: every row must see its parent's row plus itself,
    and no row may continue from a padding row."""
    b, length, _ = allowed.shape
    device = allowed.device
    positions = torch.arange(length, device=device)
    eye = torch.eye(length, dtype=torch.bool, device=device)
    causal = torch.ones(length, length, dtype=torch.bool, device=device).tril()
    trunk = (allowed == causal).all(-1).long().cumprod(-1).sum(-1)  # [B]
    strict = allowed & causal & ~eye  # earlier positions only: a row that sees later ones fails the check below
    has_parent = strict.any(-1)
    # the last visible position before l: the first True from the right
    last = length - 1 - strict.flip(-1).to(torch.uint8).argmax(-1)
    parent = torch.where(has_parent, last, torch.full_like(last, -1))
    parent_rows = torch.gather(allowed, 1, parent.clamp_min(0)[:, :, None].expand(-1, -1, length))
    expected = torch.where(has_parent[..., None], parent_rows | eye, eye)
    if not bool((allowed == expected).all()):
        return None
    after_trunk = positions[None] >= trunk[:, None]
    self_only = after_trunk & ~has_parent
    branch = after_trunk & has_parent
    if bool((branch & torch.gather(self_only, 1, parent.clamp_min(0))).any()):
        return None
    levels, placed = [], ~branch
    frontier = branch & (parent < trunk[:, None])
    while bool(frontier.any()):
        levels.append(frontier.nonzero(as_tuple=True))
        placed = placed | frontier
        frontier = branch & ~placed & torch.gather(frontier, 1, parent.clamp_min(0))
    return TreeLayout(parent, trunk, self_only, levels)


def ssd_tree(inputs: ScanInputs, layout: TreeLayout, chunk: int = 64):
    """ssd_masked under a `tree_layout` (its fast path for scoring batches: right padding,
    choices packed after their context): the chunked scan gives every trunk row (nothing after a
    row can reach it); each row after the trunk continues its parent's state one step
    (S_l = a_l S_parent + B_l x_l, y_l = C_l · S_l + D x_l), depth by depth, starting from the
    state of the trunk row it leaves from; padding rows read themselves only."""
    x, log_a, Bm, Cm, D = inputs
    y = ssd_scan(inputs, chunk)[0]
    if bool(layout.self_only.any()):
        self_only = ((Cm * Bm).sum(-1) + D)[..., None] * x  # [B, L, H, P]
        y = torch.where(layout.self_only[:, :, None, None], self_only, y)
    if not layout.levels:
        return y
    length = x.shape[1]
    bi, li = layout.levels[0]
    # the state of each trunk row that a branch leaves from (once per distinct row)
    rows, slot = torch.unique(bi * length + layout.parent[bi, li], return_inverse=True)
    rb, rt = rows // length, rows % length
    cum = torch.cumsum(log_a[rb], dim=1)  # [U, L, H]
    seen = (torch.arange(length, device=x.device)[None] <= rt[:, None])[..., None]  # s ≤ t
    weight = torch.exp(
        (cum[torch.arange(len(rows), device=x.device), rt][:, None] - cum).masked_fill(~seen, float("-inf"))
    )
    state = torch.einsum("ulh,ulhn,ulhp->uhnp", weight, Bm[rb], x[rb])[slot]
    depth_slot = torch.full_like(layout.parent, -1)
    for depth, (bi, li) in enumerate(layout.levels):
        if depth:
            state = state[depth_slot[bi, layout.parent[bi, li]]]
        state = torch.exp(log_a[bi, li])[..., None, None] * state + Bm[bi, li][..., None] * x[bi, li][..., None, :]
        out = torch.einsum("rhn,rhnp->rhp", Cm[bi, li], state) + D[None, :, None] * x[bi, li]
        y = y.index_put((bi, li), out)
        depth_slot = depth_slot.index_put((bi, li), torch.arange(len(bi), device=x.device))
    return y


def ssd_scan(inputs: ScanInputs, chunk: int = 64, state=None):
    """The chunked scan as the engine runs it: mamba-ssm's Triton kernel where it runs (a CUDA
    tensor with mamba-ssm installed: gna.engine.ssm_kernel.kernel_runs), else ssd_chunked, its
    reference (same arguments and result)."""
    x = inputs.x
    if (x.is_cuda or ssm_kernel.interpreted()) and ssm_kernel.kernel_runs(x):
        return ssm_kernel.ssd_chunked_kernel(inputs, chunk, state)
    return ssd_chunked(inputs, chunk, state)


def ssd_chunked(inputs: ScanInputs, chunk: int = 64, state=None):
    """Chunked scan of `inputs`, from `state` (None: zeros). Returns (y [B, L, H, P], final
    state [B, H, N, P])."""
    x, log_a, Bm, Cm, D = inputs
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


def causal_predecessors(length: int, width: int, device=None):
    """(index, exists), each [1, L, width]: position l − j and whether it exists (j = 1..width),
    the local skip's predecessors in plain causal order (TreeLayout.predecessors for packed
    layouts)."""
    pos = torch.arange(length, device=device)[:, None] - torch.arange(1, width + 1, device=device)[None]
    return pos.clamp_min(0)[None], (pos >= 0)[None]


def _path_rank(allowed):
    """[B, L, L] long: for each visible (l, s), how many visible positions lie after s up to and
    including l (0 on the diagonal)."""
    return allowed.flip(-1).long().cumsum(-1).flip(-1) - 1


def local_mix(x, weights, index, exists):
    """The local skip sum_j weights[h, j-1] * x[b, pred_j(l), h] (index/exists from
    causal_predecessors or TreeLayout.predecessors): x [B, L, H, P], weights [H, W] -> [B, L, H, P]."""
    b, length, h, p = x.shape
    index, exists = index.expand(b, -1, -1), exists.expand(b, -1, -1)
    out = torch.zeros_like(x)
    for j in range(weights.shape[1]):
        picked = torch.gather(x, 1, index[:, :, j, None, None].expand(b, length, h, p))
        out = out + picked * (weights[:, j][None, None, :, None] * exists[:, :, j, None, None].to(x.dtype))
    return out


def local_mix_causal(x, weights):
    """local_mix with causal_predecessors, its fast path for plain causal order (training, decoding's
    prefill): the j-th predecessor of every position is the sequence shifted by j, zeros before
    the first token — no gather forward and no scatter backward; the same sums (tested)."""
    length = x.shape[1]
    out = torch.zeros_like(x)
    for j in range(1, weights.shape[1] + 1):
        shift = min(j, length)
        shifted = torch.nn.functional.pad(x[:, : length - shift], (0, 0, 0, 0, shift, 0))
        out = out + shifted * weights[:, j - 1][None, None, :, None]
    return out


def local_matrix(weights, allowed, length: int):
    """[B or 1, H, L, L]: the local skip as a matrix (row l, column s), to add to `materialize`'s
    T; weights [H, W]; allowed: [B, L, L] tree-shaped bool visibility (None: causal)."""
    if allowed is None:
        allowed = torch.ones(length, length, dtype=torch.bool, device=weights.device).tril()[None]
    rank = _path_rank(allowed)  # [B, L, L]
    out = weights.new_zeros(allowed.shape[0], weights.shape[0], length, length)
    for j in range(weights.shape[1]):
        out = out + (allowed & (rank == j + 1))[:, None].to(weights.dtype) * weights[:, j][None, :, None, None]
    return out
