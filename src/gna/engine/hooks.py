"""Heads as one abstraction across model families, and their ablation by forward hooks.

A head is a slice of the input of one module (its *site*), zeroed by a temporary forward
pre-hook:
  attention  Llama-family attention: query head h is slice h of o_proj's input (with GQA several
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
            sites.append(HeadSite(i, layer.self_attn.o_proj, n, head_dim, "attention"))
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
