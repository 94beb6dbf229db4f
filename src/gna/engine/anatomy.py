"""A model's anatomy, read from its modules and config rather than its family name: the decoder's
layers and final norm, the family name, each layer's sliding window, and its heads' sites.

A head's site is a module whose input holds the head as one slice:
  attention  a module with query/key/value projections (separate q_proj…, fused qkv_proj,
        query_key_value, Conv1D c_attn) and an output projection (o_proj, dense, c_proj,
        out_proj): query head h is slice h of the output projection's input (with GQA several
        query heads share a K/V group; we never touch the shared K/V, only this head's output)
  ssm   Mamba-2 mixer: head h is slice h of y, the scan output entering the gated norm and
        out_proj
  ssm-channels  Mamba-1 mixer: inner channels entering out_proj, in `groups` equal groups
A layer may hold several sites (Zamba2's hybrid layers: a Mamba-2 mixer and an attention
block); its heads are numbered across them in module order. The engine's stack, hooks and the
students' mixer all read these; this module imports nothing of theirs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# decoder-layer containers and final norms across families (Llama/Gemma/Qwen/Phi/OLMo: layers,
# norm; GPT-2: h, ln_f; GPT-NeoX: final_layer_norm; Mamba: norm_f; Zamba2: final_layernorm)
LAYER_LISTS = ("layers", "h", "blocks")
FINAL_NORMS = ("norm", "final_layernorm", "final_layer_norm", "ln_f", "norm_f")


class UnsupportedModel(TypeError):
    pass


def family_of(model) -> str:
    return getattr(model.config, "model_type", None) or type(model).__name__


def _named_child(model, names: tuple[str, ...], kind: type, what: str) -> tuple[str, torch.nn.Module]:
    """(name, module) of the first of `names` that the decoder (`base_model`) has as a `kind`."""
    base = model.base_model
    for name in names:
        child = getattr(base, name, None)
        if isinstance(child, kind):
            return name, child
    raise UnsupportedModel(f"{family_of(model)} ({type(base).__name__}): no {what} (looked for {', '.join(names)})")


def soft_capped(config) -> bool:
    """Whether `config` (or its text config) caps attention logits (Gemma 2: tanh at
    attn_logit_softcapping)."""
    try:  # a config with several text sub-configs names none without decoder=True
        text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    except ValueError:
        text = config
    return getattr(text, "attn_logit_softcapping", None) is not None


def eager_where_capped(model):
    """`model`, on eager attention where its config caps attention logits: transformers <= 5.18
    ran Gemma 2 on sdpa, which drops the cap without a word (logits 3.6e-3 off on a tiny model)."""
    if soft_capped(model.config):
        model.set_attn_implementation("eager")
    return model


def engine_ready(model):
    """`model` as every loader hands it to the engine, whatever transformers chose when it was
    built: eager attention where logits are soft-capped (eager_where_capped), CPU tensors through
    transformers' torch scans where it bound mamba-ssm's kernels (gna.engine.ssm_kernel.cpu_scans_in_torch)."""
    from gna.engine.ssm_kernel import cpu_scans_in_torch

    return cpu_scans_in_torch(eager_where_capped(model))


def check_attention_path(model) -> None:
    """Raise UnsupportedModel where a soft-capped model runs another attention path than eager."""
    path = getattr(model.config, "_attn_implementation", None)
    if soft_capped(model.config) and path != "eager":
        raise UnsupportedModel(
            f"{family_of(model)} ({type(model).__name__}) caps its attention logits (attn_logit_softcapping) "
            f"but runs {path!r} attention, which may drop the cap: load it with attn_implementation='eager' "
            "(gna's loaders do: gna.engine.anatomy.eager_where_capped)"
        )


def layer_list(model) -> tuple[str, torch.nn.ModuleList]:
    """(attribute name, module list) of the decoder's layers."""
    return _named_child(model, LAYER_LISTS, torch.nn.ModuleList, "list of decoder layers")


def decoder_layers(model) -> torch.nn.ModuleList:
    return layer_list(model)[1]


def final_norm(model) -> torch.nn.Module:
    return _named_child(model, FINAL_NORMS, torch.nn.Module, "final norm")[1]


def sliding_windows(config, n_layers: int) -> list[int | None]:
    """Per layer, the sliding-window size its attention uses (None: full causal attention), as
    the config declares it: per-layer `layer_types` (Gemma 2/3, Qwen2/3, …) or one
    `sliding_window` for every layer (Mistral)."""
    window = getattr(config, "sliding_window", None)
    types = getattr(config, "layer_types", None)
    if types is not None:
        unknown = sorted(
            {t for t in types}
            - {"full_attention", "sliding_attention", "linear_attention", "hybrid", "mamba", "attention"}
        )
        if unknown:
            raise UnsupportedModel(
                f"{config.model_type}: layer types {unknown} are not supported "
                "(supported: full and sliding-window attention, SSM layers)"
            )
        return [window if t == "sliding_attention" else None for t in types[:n_layers]]
    if window is not None and getattr(config, "use_sliding_window", True):
        return [window] * n_layers
    return [None] * n_layers


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


def kv_groups(model) -> dict[tuple[int, int], list[tuple[int, int]]]:
    """{(layer, g): the query heads that read key/value head g of that layer}, every layer: in
    grouped-query attention query head h reads key/value head h // (query heads per key/value head),
    as transformers repeats them (one group per head where every head has its own keys and values)."""
    groups: dict[tuple[int, int], list[tuple[int, int]]] = {}
    n_kv = getattr(model.config, "num_key_value_heads", None)
    for s in head_sites(model):
        if s.kind != "attention":
            raise UnsupportedModel(f"layer {s.layer}: {s.kind} heads have no key/value groups")
        kv = n_kv or s.n_heads
        if s.n_heads % kv:
            raise UnsupportedModel(f"layer {s.layer}: {s.n_heads} query heads do not split over {kv} key/value heads")
        per = s.n_heads // kv
        for h in range(s.n_heads):
            groups.setdefault((s.layer, (s.offset + h) // per), []).append((s.layer, s.offset + h))
    return groups
