"""Pack a context and all of its choices into one sequence scored by a single forward pass.

    tokens:    [ctx_0 … ctx_{L-1} | c1_0 … c1_{n1-2} | c2_0 … | …]
    positions: [0 … L-1           | L … L+n1-2      | L …     | …]

Each choice's tokens attend to the whole context and to their own earlier tokens only (a
block mask), and their positions continue from the context, so every logit equals the one a
separate forward of context + choice would give. The last token of a choice is never fed: it
is only predicted. Items are right-padded into batches; padding attends only to itself.

`pack_tree` packs several contexts that share a prefix (one fact asked under each rotation of
its options) one level deeper: the prefix once, each context's rest as a branch that sees the
prefix and itself, and that context's choices after it, each seeing the prefix, its branch and
itself. Every logit is again the one a separate forward would give.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

CONTEXT = -1
PAD = -2


@dataclass
class PackedItem:
    ids: list[int]
    positions: list[int]
    segment: list[int]  # CONTEXT, or the choice index (pack_tree: or a branch's own index)
    score_at: list[list[int]]  # per choice: packed positions whose logits predict its tokens
    targets: list[list[int]]  # per choice: the token ids predicted there
    # per position, the segment of the branch it continues (pack_tree), which it also sees;
    # None: none (every choice continues the context itself)
    branch: list[int] | None = None

    @property
    def context_length(self) -> int:
        return self.segment.count(CONTEXT)


def pack(context: list[int], choices: list[list[int]]) -> PackedItem:
    ids, positions, segment = list(context), list(range(len(context))), [CONTEXT] * len(context)
    score_at, targets = [], []
    for j, cont in enumerate(choices):
        where = [len(context) - 1]
        for t, tok in enumerate(cont[:-1]):
            where.append(len(ids))
            ids.append(tok)
            positions.append(len(context) + t)
            segment.append(j)
        score_at.append(where)
        targets.append(list(cont))
    return PackedItem(ids, positions, segment, score_at, targets)


def pack_tree(prefix: list[int], branches: list[tuple[list[int], list[list[int]]]]) -> PackedItem:
    """Contexts prefix + rest that share `prefix`, each with its choices (`branches`: [(rest,
    choices)], every rest at least one token), as one sequence: the prefix, then per context its
    rest and its choices (as `pack` places them after a context). The choices are numbered in
    order over the contexts (the second context's first choice follows the first context's
    last). Segments: CONTEXT for the prefix; each rest and each choice one of its own."""
    if not prefix or any(not rest for rest, _ in branches):
        raise ValueError("pack_tree needs a prefix and a rest of at least one token per context")
    ids, positions = list(prefix), list(range(len(prefix)))
    segment, branch = [CONTEXT] * len(prefix), [CONTEXT] * len(prefix)
    score_at, targets = [], []
    n_choices = sum(len(choices) for _, choices in branches)
    for b, (rest, choices) in enumerate(branches):
        own = n_choices + b  # after every choice's index
        start = len(ids)
        ids += rest
        positions += range(len(prefix), len(prefix) + len(rest))
        segment += [own] * len(rest)
        branch += [own] * len(rest)
        after = len(prefix) + len(rest)  # the position a choice's first token takes
        for cont in choices:  # as `pack` places them after a context
            fed = cont[:-1]
            segment += [len(score_at)] * len(fed)
            score_at.append([start + len(rest) - 1, *range(len(ids), len(ids) + len(fed))])
            targets.append(list(cont))
            ids += fed
            positions += range(after, after + len(fed))
            branch += [own] * len(fed)
    return PackedItem(ids, positions, segment, score_at, targets, branch)


@dataclass
class PackedBatch:
    ids: torch.Tensor  # [B, T]
    positions: torch.Tensor  # [B, T]
    mask: torch.Tensor  # [B, 1, T, T] additive float mask (0 = may attend)
    items: list[PackedItem]
    _windowed: dict = field(default_factory=dict, repr=False)

    def window_mask(self, window: int) -> torch.Tensor:
        """The block mask narrowed to a sliding window over positions (a query at position p sees
        keys at positions > p - window), as a windowed attention layer sees the unpacked sequence."""
        if window not in self._windowed:
            distance = self.positions[:, :, None] - self.positions[:, None, :]
            outside = (distance >= window)[:, None]
            self._windowed[window] = self.mask.masked_fill(outside, torch.finfo(self.mask.dtype).min)
        return self._windowed[window]


def collate(
    items: list[PackedItem], dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu"
) -> PackedBatch:
    """Pad `items` into one batch on `device` (the model's: gna.engine.device.device_of)."""
    width = max(len(it.ids) for it in items)
    ids = torch.zeros(len(items), width, dtype=torch.long, device=device)
    pos = torch.zeros(len(items), width, dtype=torch.long, device=device)
    seg = torch.full((len(items), width), PAD, dtype=torch.long, device=device)
    branch = torch.full((len(items), width), PAD, dtype=torch.long, device=device)
    for b, it in enumerate(items):
        n = len(it.ids)
        ids[b, :n] = torch.tensor(it.ids, device=device)
        pos[b, :n] = torch.tensor(it.positions, device=device)
        seg[b, :n] = torch.tensor(it.segment, device=device)
        branch[b, :n] = torch.tensor(it.segment if it.branch is None else it.branch, device=device)
    q, k = seg[:, :, None], seg[:, None, :]
    causal = torch.ones(width, width, dtype=torch.bool, device=device).tril()
    allowed = causal & ((k == CONTEXT) | (k == q) | (k == branch[:, :, None])) & (q != PAD)
    allowed |= torch.eye(width, dtype=torch.bool, device=device)  # padding rows see themselves: no empty softmax
    mask = torch.zeros(len(items), 1, width, width, dtype=dtype, device=device)
    mask.masked_fill_(~allowed[:, None], torch.finfo(dtype).min)
    return PackedBatch(ids, pos, mask, items)
