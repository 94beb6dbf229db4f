"""Heads as one abstraction across model families, and their ablation by forward hooks.

A head is a slice of the input of one module (its *site*), zeroed by a temporary forward
pre-hook. Sites are found by the shape of a layer's modules, not by family name:
  attention  a module with query/key/value projections (separate q_proj…, fused qkv_proj,
        query_key_value, Conv1D c_attn) and an output projection (o_proj, dense, c_proj,
        out_proj): query head h is slice h of the output projection's input (with GQA several
        query heads share a K/V group; we never touch the shared K/V, only this head's output)
  ssm   Mamba-2 mixer: head h is slice h of y, the scan output entering the gated norm and
        out_proj
  ssm-channels  Mamba-1 mixer: inner channels entering out_proj, in `groups` equal groups
A layer may hold several sites (Zamba2's hybrid layers: a Mamba-2 mixer and an attention
block); its heads are numbered across them in module order.
Hooks live only inside `ablate_heads`; they are removed in `finally`, also on error.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

QKV_NAMES = ("q_proj", "qkv_proj", "query_key_value", "c_attn", "Wqkv")
OUT_PROJ_NAMES = ("o_proj", "dense", "c_proj", "out_proj")


@dataclass(frozen=True)
class HeadSite:
    layer: int
    module: torch.nn.Module  # whose input[0] is split into heads along its last dimension
    n_heads: int
    head_dim: int
    kind: str
    offset: int = 0  # number of the layer's heads in its earlier sites


def _in_features(proj: torch.nn.Module) -> int:
    # nn.Linear stores [out, in]; GPT-2's Conv1D stores [in, out] and says so in `nx`
    return getattr(proj, "in_features", None) or getattr(proj, "nx", None) or proj.weight.shape[0]


def _n_query_heads(module, config) -> int | None:
    for owner, name in ((module, "num_heads"), (module, "num_attention_heads"), (config, "num_attention_heads")):
        n = getattr(owner, name, None)
        if isinstance(n, int) and n > 0:
            return n
    return None


def _layer_sites(i: int, layer: torch.nn.Module, config, ssm_channel_groups: int) -> list[HeadSite]:
    from gna.engine.stack import UnsupportedModel

    sites, offset, taken = [], 0, set()
    for name, m in layer.named_modules():
        if any(name.startswith(t + ".") for t in taken):
            continue
        if any(hasattr(m, q) for q in QKV_NAMES) and any(hasattr(m, o) for o in OUT_PROJ_NAMES):
            proj = next(getattr(m, o) for o in OUT_PROJ_NAMES if hasattr(m, o))
            n, width = _n_query_heads(m, config), _in_features(proj)
            if n is None or width % n:
                raise UnsupportedModel(f"layer {i} ({name}): cannot split {width} attention channels into heads")
            site = HeadSite(i, proj, n, width // n, "attention", offset)
        elif all(hasattr(m, a) for a in ("num_heads", "head_dim", "norm", "out_proj")):
            site = HeadSite(i, m.norm, m.num_heads, m.head_dim, "ssm", offset)
        elif all(hasattr(m, a) for a in ("x_proj", "dt_proj", "out_proj")):
            inner = _in_features(m.out_proj)
            if inner % ssm_channel_groups:
                raise ValueError(f"layer {i}: {inner} inner channels do not split into {ssm_channel_groups} groups")
            site = HeadSite(i, m.out_proj, ssm_channel_groups, inner // ssm_channel_groups, "ssm-channels", offset)
        else:
            continue
        sites.append(site)
        taken.add(name)
        offset += site.n_heads
    return sites


def head_sites(model, ssm_channel_groups: int = 16) -> list[HeadSite]:
    """Every site, in layer order (a layer's sites in module order)."""
    from gna.engine.stack import UnsupportedModel, decoder_layers, family_of

    sites = []
    for i, layer in enumerate(decoder_layers(model)):
        found = _layer_sites(i, layer, model.config, ssm_channel_groups)
        if not found:
            raise UnsupportedModel(
                f"layer {i} of {family_of(model)} ({type(layer).__name__}): no attention with an output "
                f"projection ({', '.join(OUT_PROJ_NAMES)}) and no Mamba mixer found"
            )
        sites += found
    return sites


def heads_per_layer(sites: list[HeadSite]) -> dict[int, int]:
    counts: dict[int, int] = {}
    for s in sites:
        counts[s.layer] = counts.get(s.layer, 0) + s.n_heads
    return counts


def site_of(sites: list[HeadSite], layer: int, head: int) -> tuple[HeadSite, int]:
    """The site holding head `head` of layer `layer`, and the head's index within it."""
    for s in sites:
        if s.layer == layer and s.offset <= head < s.offset + s.n_heads:
            return s, head - s.offset
    raise ValueError(f"no head {head} in layer {layer}")


def all_heads(model) -> list[tuple[int, int]]:
    return [(s.layer, s.offset + h) for s in head_sites(model) for h in range(s.n_heads)]


class HookNotFired(RuntimeError):
    pass


@contextlib.contextmanager
def ablate_heads(model, heads: list[tuple[int, int]], sites: list[HeadSite] | None = None):
    """Zero the outputs of `heads` [(layer, head), …] while the block runs.

    Raises HookNotFired if the model ran but a hook never saw its input (a fused kernel that
    bypasses the hooked module would silently ablate nothing)."""
    sites = sites or head_sites(model)
    chosen: dict[HeadSite, list[int]] = {}
    for layer, head in heads:
        site, local = site_of(sites, layer, head)
        chosen.setdefault(site, []).append(local)
    handles, fired = [], {layer: 0 for layer, _ in heads}

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
        for site, idx in chosen.items():
            handles.append(site.module.register_forward_pre_hook(make_hook(site, sorted(idx))))
        handles.append(model.get_input_embeddings().register_forward_pre_hook(count_run))
        yield fired
    finally:
        for handle in handles:
            handle.remove()
    # reached only when the block succeeded: a full forward ran but a head's module was bypassed
    silent = [layer for layer, n in fired.items() if n == 0]
    if runs[0] and silent:
        raise HookNotFired(
            f"ablation hooks in layers {silent} never fired although the model ran "
            "(a fused kernel bypasses the hooked module?)"
        )


def active_hooks(model) -> int:
    """Number of forward hooks (pre and post) of gna's code currently installed on any module
    (tests assert 0; transformers keeps output-capturing hooks of its own)."""
    return sum(
        getattr(hook, "__module__", "").startswith("gna.")
        for m in model.modules()
        for hook in (*m._forward_pre_hooks.values(), *m._forward_hooks.values())
    )
