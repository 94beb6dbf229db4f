"""Head ablation by forward hooks: a head (a slice of the input of its site, gna.engine.anatomy) is
zeroed by a temporary forward pre-hook. Hooks live only inside `ablate_heads`; they are removed in
`finally`, also on error.
"""

from __future__ import annotations

import contextlib

from gna.engine.anatomy import HeadSite, head_sites, site_of


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
