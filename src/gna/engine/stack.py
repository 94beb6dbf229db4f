"""An explicit layer loop over a decoder-only transformer: embed → layers → norm → head.

Owning the loop lets one forward serve many variants exactly: read out after any depth (layer
pruning from the end), resume from a cached hidden state with a layer removed, or rerun only
layers L..end with one head ablated. Works for the Llama family in transformers (Llama,
Mistral, Qwen2/3, SmolLM…): `base_model` with embed_tokens, layers, norm, rotary_emb, and
decoder layers called as layer(h, attention_mask=, position_ids=, position_embeddings=).
The model's own forward is the reference (tests keep them equal).
"""

from __future__ import annotations

import torch

from gna.engine.packing import PackedBatch


class UnsupportedModel(TypeError):
    pass


class DecoderStack:
    def __init__(self, model):
        base = model.base_model
        missing = [a for a in ("embed_tokens", "layers", "norm", "rotary_emb") if not hasattr(base, a)]
        if missing:
            raise UnsupportedModel(f"{type(model).__name__} has no {missing}; the layer loop needs a "
                                   "Llama-family decoder")
        self.model = model
        self.base = base
        self.layers = list(base.layers)
        self.n_layers = len(self.layers)
        self.head = model.get_output_embeddings()

    @staticmethod
    def supports(model) -> bool:
        return all(hasattr(model.base_model, a) for a in ("embed_tokens", "layers", "norm", "rotary_emb"))

    def embed(self, batch: PackedBatch) -> tuple[torch.Tensor, tuple]:
        h = self.base.embed_tokens(batch.ids)
        return h, self.base.rotary_emb(h, position_ids=batch.positions)

    def run(self, h: torch.Tensor, batch: PackedBatch, rope: tuple, layers: list[int],
            masks: dict[int, torch.Tensor] | None = None) -> torch.Tensor:
        """Run `layers` in order from the hidden state `h`. masks: {layer: additive attention
        mask [B, 1 or heads, T, T]} used instead of the batch's packed mask in those layers."""
        packed = batch.mask.to(h.dtype)
        masks = masks or {}
        for i in layers:
            h = self.layers[i](h, attention_mask=masks.get(i, packed), position_ids=batch.positions,
                               position_embeddings=rope)
        return h

    def readout(self, h: torch.Tensor, batch: PackedBatch, normed: bool = False):
        """Per item: (summed log-prob per choice, greedy flag per choice), from the hidden state
        `h` after some layer (the final norm is applied here unless `normed`)."""
        # Unique positions only: every choice's first token is predicted at the same (last
        # context) position, so projecting per (choice, token) would repeat the vocab matmul.
        where: dict[tuple[int, int], int] = {}
        for b, item in enumerate(batch.items):
            for positions in item.score_at:
                for p in positions:
                    where.setdefault((b, p), len(where))
        rows = torch.tensor([b for b, _ in where], device=h.device)
        cols = torch.tensor([p for _, p in where], device=h.device)
        hidden = h[rows, cols]
        if not normed:
            hidden = self.base.norm(hidden)
        logp = torch.log_softmax(self.head(hidden).float(), dim=-1)
        best = logp.argmax(-1)
        out = []
        for b, item in enumerate(batch.items):
            totals, greedy = [], []
            for positions, targets in zip(item.score_at, item.targets):
                idx = torch.tensor([where[(b, p)] for p in positions], device=h.device)
                tgt = torch.tensor(targets, device=h.device)
                totals.append(float(logp[idx, tgt].sum()))
                greedy.append(bool((best[idx] == tgt).all()))
            out.append((totals, greedy))
        return out

    def target_logprob(self, h: torch.Tensor, batch: PackedBatch, targets: list[int]) -> torch.Tensor:
        """Differentiable log-prob of each item's target choice (summed over its tokens)."""
        rows, cols, toks, owner = [], [], [], []
        for b, (item, target) in enumerate(zip(batch.items, targets)):
            for p, t in zip(item.score_at[target], item.targets[target]):
                rows.append(b)
                cols.append(p)
                toks.append(t)
                owner.append(b)
        on = {"device": h.device}
        hidden = self.base.norm(h[torch.tensor(rows, **on), torch.tensor(cols, **on)])
        logp = torch.log_softmax(self.head(hidden).float(), dim=-1)
        picked = logp[torch.arange(len(toks), **on), torch.tensor(toks, **on)]
        return torch.zeros(len(batch.items), dtype=picked.dtype, **on).index_add(0, torch.tensor(owner, **on), picked)
