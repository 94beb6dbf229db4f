"""Heads as one abstraction across model families, and their ablation.

A head is a slice of the input of one module (its *site*), zeroed by a temporary forward
pre-hook:
  attn  Llama-family attention: query head h is slice h of o_proj's input (with GQA several
        query heads share a K/V group; we never touch the shared K/V, only this head's output)
  ssm   Mamba-2 mixer: head h is slice h of y, the scan output entering the gated norm and
        out_proj
  ssm-channels  Mamba-1 mixer: inner channels entering out_proj, in `groups` equal groups
Hooks live only inside `ablate_heads`; they are removed in `finally`, also on error.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class HeadSite:
    layer: int
    module: torch.nn.Module  # whose input[0] is split into heads along its last dimension
    n_heads: int
    head_dim: int
    kind: str


def head_sites(model, ssm_channel_groups: int = 16) -> list[HeadSite]:
    """One site per layer, in layer order."""
    cfg = model.config
    base = model.base_model
    layers = getattr(base, "layers", None)
    if layers is None:
        raise TypeError(f"{type(model).__name__}: no decoder layers found")
    sites = []
    for i, layer in enumerate(layers):
        if hasattr(layer, "self_attn") and hasattr(layer.self_attn, "o_proj"):
            n = cfg.num_attention_heads
            head_dim = getattr(layer.self_attn, "head_dim", None) or cfg.hidden_size // n
            sites.append(HeadSite(i, layer.self_attn.o_proj, n, head_dim, "attn"))
        elif hasattr(layer, "mixer") and hasattr(layer.mixer, "num_heads") and hasattr(layer.mixer, "norm"):
            mixer = layer.mixer
            sites.append(HeadSite(i, mixer.norm, mixer.num_heads, mixer.head_dim, "ssm"))
        elif hasattr(layer, "mixer") and hasattr(layer.mixer, "out_proj"):
            inner = layer.mixer.out_proj.in_features
            if inner % ssm_channel_groups:
                raise ValueError(f"layer {i}: {inner} inner channels do not split into {ssm_channel_groups} groups")
            sites.append(HeadSite(i, layer.mixer.out_proj, ssm_channel_groups, inner // ssm_channel_groups,
                                  "ssm-channels"))
        else:
            raise TypeError(f"layer {i} of {type(model).__name__}: neither attention nor a Mamba mixer")
    return sites


def all_heads(model) -> list[tuple[int, int]]:
    return [(s.layer, h) for s in head_sites(model) for h in range(s.n_heads)]


class HookNotFired(RuntimeError):
    pass


@contextlib.contextmanager
def ablate_heads(model, heads: list[tuple[int, int]], sites: list[HeadSite] | None = None):
    """Zero the outputs of `heads` [(layer, head), …] while the block runs.

    Raises HookNotFired if the model ran but a hook never saw its input (a fused kernel that
    bypasses the hooked module would silently ablate nothing)."""
    sites = sites or head_sites(model)
    by_layer: dict[int, list[int]] = {}
    for layer, head in heads:
        if not 0 <= layer < len(sites) or not 0 <= head < sites[layer].n_heads:
            raise ValueError(f"no head {head} in layer {layer}")
        by_layer.setdefault(layer, []).append(head)
    handles, fired = [], {layer: 0 for layer in by_layer}

    def make_hook(site: HeadSite, idx: list[int]):
        def hook(module, args):
            x = args[0]
            shape = x.shape
            x = x.reshape(*shape[:-1], site.n_heads, site.head_dim).clone()
            x[..., idx, :] = 0
            fired[site.layer] += 1
            return (x.reshape(shape), *args[1:])
        return hook

    runs = [0]

    def count_run(module, args):
        runs[0] += 1

    try:
        for layer, idx in by_layer.items():
            handles.append(sites[layer].module.register_forward_pre_hook(make_hook(sites[layer], sorted(idx))))
        handles.append(model.get_input_embeddings().register_forward_pre_hook(count_run))
        yield fired
    finally:
        for handle in handles:
            handle.remove()
    # reached only when the block succeeded: a full forward ran but a head's module was bypassed
    silent = [layer for layer, n in fired.items() if n == 0]
    if runs[0] and silent:
        raise HookNotFired(f"ablation hooks in layers {silent} never fired although the model ran "
                           "(a fused kernel bypasses the hooked module?)")


def active_hooks(model) -> int:
    """Number of forward pre-hooks currently installed on any module (tests assert 0)."""
    return sum(len(m._forward_pre_hooks) for m in model.modules())


# --------------------------------------------------------------------------------------------
# Per-head ablation sweep, ranking, and attribution pre-ranking


def _summary(frame) -> dict:
    return {"acc": float(frame["correct"].mean()), "mean_logp": float(frame["logp_target"].mean()),
            "n": len(frame)}


def sweep_heads(model, tok, table, heads: list[tuple[int, int]] | None = None, batch_size: int = 8,
                progress: bool = True):
    """Ablate each head alone; accuracy and mean log-prob of the correct choice per head.

    Fast and exact for Llama-family models: the hidden state entering layer L is computed once
    per batch and only layers L..end rerun for that layer's heads (gna.scoring.score_variants).
    Other families (SSMs) fall back to one full forward per head. Returns one row per head plus
    a row with layer = head = -1 for the unablated model."""
    import polars as pl

    from gna.scoring import Variant, score_table, score_variants
    from gna.stack import DecoderStack

    sites = head_sites(model)
    heads = heads if heads is not None else [(s.layer, h) for s in sites for h in range(s.n_heads)]
    base = score_table(model, tok, table, batch_size=batch_size, progress=False)
    if DecoderStack.supports(model):
        layers = list(range(len(sites)))
        variants = [Variant((layer, head), layer, layers[layer:],
                            context=lambda layer=layer, head=head: ablate_heads(model, [(layer, head)], sites))
                    for layer, head in heads]
        frames = score_variants(model, tok, table, layers, variants, batch_size, progress, desc="head sweep")
    else:
        frames = sweep_heads_naive(model, tok, table, heads, batch_size, progress, sites)
    rows = [{"layer": -1, "head": -1, "kind": "none", **_summary(base)}]
    rows += [{"layer": layer, "head": head, "kind": sites[layer].kind, **_summary(frames[(layer, head)])}
             for layer, head in heads]
    return pl.DataFrame(rows)


def sweep_heads_naive(model, tok, table, heads, batch_size: int = 8, progress: bool = True, sites=None) -> dict:
    """Reference: one full forward of the whole model per ablated head."""
    from tqdm.auto import tqdm

    from gna.scoring import score_table

    sites = sites or head_sites(model)
    out = {}
    for layer, head in tqdm(heads, desc="head sweep (naive)", disable=not progress, mininterval=2.0):
        with ablate_heads(model, [(layer, head)], sites):
            out[(layer, head)] = score_table(model, tok, table, batch_size=batch_size, progress=False)
    return out


def rank_heads(sweep):
    """acc_drop / logp_drop against the unablated row; rank 1 = most harmful to remove
    (accuracy drop first, log-prob drop breaks ties)."""
    import polars as pl

    base = sweep.filter(pl.col("layer") == -1).row(0, named=True)
    heads = sweep.filter(pl.col("layer") >= 0).with_columns(
        (base["acc"] - pl.col("acc")).alias("acc_drop"),
        (base["mean_logp"] - pl.col("mean_logp")).alias("logp_drop"),
    ).sort(["acc_drop", "logp_drop", "layer", "head"], descending=[True, True, False, False])
    return heads.with_columns(pl.int_range(1, len(heads) + 1).alias("rank"))


def attribution_scores(model, tok, table, batch_size: int = 8, progress: bool = True):
    """Attribution patching: a linear estimate of every head's ablation effect on the mean
    log-prob of the correct choice, from one forward and one backward pass per batch.

    For head output z (its slice of the site's input) and gradient g of the metric, zeroing z
    changes the metric by about -<g, z>; the estimated drop is <g, z> summed over positions."""
    import polars as pl
    from tqdm.auto import tqdm

    from gna.packing import collate, pack
    from gna.scoring import _batches, _encode_table
    from gna.stack import DecoderStack

    stack = DecoderStack(model)
    sites = head_sites(model)
    packed = [pack(e.context, e.choices) for e in _encode_table(tok, table)]
    targets = table["target"].to_list()
    est = {s.layer: torch.zeros(s.n_heads, dtype=torch.float64) for s in sites}
    dtype = next(model.parameters()).dtype
    captured: dict[int, torch.Tensor] = {}

    def capture(layer):
        def hook(module, args):
            z = args[0]
            z.retain_grad()
            captured[layer] = z
        return hook

    handles = [s.module.register_forward_pre_hook(capture(s.layer)) for s in sites]
    try:
        for chunk in tqdm(_batches(packed, batch_size), desc="attribution", disable=not progress, mininterval=2.0):
            batch = collate([packed[i] for i in chunk], dtype)
            with torch.enable_grad():
                h, rope = stack.embed(batch)
                h = h.detach().requires_grad_(True)  # gradients flow from here through every layer
                h = stack.run(h, batch, rope, list(range(stack.n_layers)))
                logp = stack.target_logprob(h, batch, [targets[i] for i in chunk])
                (logp.sum() / len(packed)).backward()
            for s in sites:
                z, g = captured[s.layer], captured[s.layer].grad
                shape = (*z.shape[:-1], s.n_heads, s.head_dim)
                est[s.layer] += (z.detach().reshape(shape) * g.reshape(shape)).sum(dim=(0, 1, 3)).double()
            model.zero_grad(set_to_none=True)
    finally:
        for handle in handles:
            handle.remove()
    rows = [{"layer": s.layer, "head": h, "kind": s.kind, "logp_drop_est": float(est[s.layer][h])}
            for s in sites for h in range(s.n_heads)]
    return pl.DataFrame(rows)


def spearman(a: list[float], b: list[float]) -> float:
    import numpy as np
    from scipy.stats import spearmanr

    return float(spearmanr(np.asarray(a), np.asarray(b)).statistic)
