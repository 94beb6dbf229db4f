"""The layer loop of any decoder-only causal LM in transformers, driven by the model's own forward.

Owning the loop lets one forward serve many variants exactly: read out after any depth (layer
pruning from the end), resume from a cached hidden state with a layer removed, or rerun only
layers L..end with one head ablated. Nothing of a family's forward is copied here: one pass of
the model's own decoder (`base_model`) records, for every layer, the hidden state entering it
and the exact arguments the model called it with (masks, rotary tables per layer type,
embedding scale, shared inputs); variants then call the layers themselves with those arguments.
What the engine adds is the model-independent part: the packed block mask (gna.engine.packing),
narrowed per layer to the model's sliding window where its config declares one, and the
read-out (final norm, head, logit soft-cap) at scored positions only. `check_engine` compares
it once per model with the model's own forward and names the family and the mismatch if any.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import weakref
from dataclasses import dataclass, field

import torch

from gna.core import work
from gna.engine.anatomy import (
    UnsupportedModel,
    check_attention_path,
    decoder_layers,
    family_of,
    final_norm,
    head_sites,
    layer_list,
    sliding_windows,
)
from gna.engine.packing import PackedBatch, collate, pack
from gna.engine.precision import linears_in_full_precision


@contextlib.contextmanager
def pruned_layers(model, keep: list[int]):
    """Temporarily make `model` consist of the decoder layers `keep` (in that order): the
    reference for pruning, run by the model's own forward (with or without a cache).

    Layers get renumbered `layer_idx` so a cache stays aligned, and per-layer config lists
    (`layer_types`) follow; everything is restored in `finally`, also on error."""
    base = model.base_model
    name, original = layer_list(model)
    cfg = model.config
    saved_cfg = {
        k: getattr(cfg, k)
        for k in ("num_hidden_layers", "layer_types", "layers_block_type")
        if getattr(cfg, k, None) is not None and not isinstance(getattr(type(cfg), k, None), property)
    }
    saved_idx = [(m, m.layer_idx) for m in base.modules() if hasattr(m, "layer_idx")]
    try:
        setattr(base, name, torch.nn.ModuleList([original[i] for i in keep]))
        for new, layer in enumerate(getattr(base, name)):
            for m in layer.modules():
                if hasattr(m, "layer_idx"):
                    m.layer_idx = new
        cfg.num_hidden_layers = len(keep)
        for key in ("layer_types", "layers_block_type"):
            if key in saved_cfg:
                setattr(cfg, key, [saved_cfg[key][i] for i in keep])
        yield model
    finally:
        setattr(base, name, original)
        for k, v in saved_cfg.items():
            setattr(cfg, k, v)
        for m, idx in saved_idx:
            m.layer_idx = idx


# a decoder layer's MLP, by its name in transformers' families
POSITIONWISE_MLPS = ("mlp", "feed_forward")


@dataclass
class LayerCall:
    """How the model's own forward called one decoder layer, every argument by name (GPT-2 passes
    some positionally): `hidden` names the hidden-state parameter, `kwargs` holds the others."""

    hidden: str
    kwargs: dict

    @classmethod
    def bind(cls, layer: torch.nn.Module, args: tuple, kwargs: dict) -> tuple[LayerCall, torch.Tensor]:
        """(the call, the hidden state) from a forward pre-hook's (args, kwargs)."""
        sig = inspect.signature(layer.forward)
        bound = sig.bind(*args, **kwargs)
        named = {}
        for name, value in bound.arguments.items():
            kind = sig.parameters[name].kind
            if kind is inspect.Parameter.VAR_KEYWORD:
                named.update(value)
            elif kind is inspect.Parameter.VAR_POSITIONAL:
                if value:
                    raise UnsupportedModel(f"{type(layer).__name__} is called with extra positional arguments")
            else:
                named[name] = value
        hidden = next(iter(sig.parameters))
        return cls(hidden, named), named.pop(hidden)

    def with_mask(self, mask: torch.Tensor) -> LayerCall:
        return LayerCall(self.hidden, {**self.kwargs, "attention_mask": mask})

    def __call__(self, layer: torch.nn.Module, h: torch.Tensor) -> torch.Tensor:
        out = layer(**{self.hidden: h}, **self.kwargs)
        return out[0] if isinstance(out, tuple) else out


@dataclass
class Pass:
    """One recorded forward of the model's decoder over `layers` (original indices, in order)."""

    layers: list[int]
    entering: dict[int, torch.Tensor] = field(default_factory=dict)  # hidden state entering a layer
    calls: dict[int, LayerCall] = field(default_factory=dict)
    final: torch.Tensor | None = None  # after the last layer, before the norm

    def after(self, k: int) -> torch.Tensor:
        """The hidden state after the first k of `layers` (k = 0: the embedded input)."""
        return self.final if k == len(self.layers) else self.entering[self.layers[k]]


class DecoderStack:
    def __init__(self, model):
        check_attention_path(model)
        self.model = model
        self.base = model.base_model
        self.layers = list(decoder_layers(model))
        self.n_layers = len(self.layers)
        self.norm = final_norm(model)
        self.head = model.get_output_embeddings()
        if self.head is None:
            raise UnsupportedModel(f"{family_of(model)}: no output embeddings (not a causal LM head)")
        self.softcap = getattr(model.config, "final_logit_softcapping", None)
        self.windows = sliding_windows(model.config, self.n_layers)
        # a context and all its choices share one sequence only where every layer honours the
        # block mask: attention layers do, a recurrent (SSM) layer would read the other choices
        sites = head_sites(model)
        self.packs_choices = all(s.kind == "attention" for s in sites)
        # useful FLOPs (gna.core.work): per token through each layer, and its attention's query width
        self.token_flops = [work.linear_flops(layer) for layer in self.layers]
        self.attention_width = [0] * self.n_layers
        # per layer, the parts that act on each position alone: its MLP and its attention's output
        # projections (where a layer has an SSM site, none: its scan reads along the sequence)
        self.positionwise: list[list[torch.nn.Module]] = [[] for _ in self.layers]
        for site in sites:
            if site.kind == "attention":
                self.attention_width[site.layer] += site.n_heads * site.head_dim
                self.positionwise[site.layer].append(site.module)
        for i, layer in enumerate(self.layers):
            mlp = next(
                (getattr(layer, n) for n in POSITIONWISE_MLPS if isinstance(getattr(layer, n, None), torch.nn.Module)),
                None,
            )
            if any(s.layer == i and s.kind != "attention" for s in sites):
                self.positionwise[i] = []
            elif mlp is not None:
                self.positionwise[i].append(mlp)
        params = inspect.signature(self.base.forward).parameters
        self._takes_positions = "position_ids" in params

    def _mask(self, batch: PackedBatch, layer: int, masks: dict | None) -> torch.Tensor:
        mask = masks.get(layer) if masks else None
        window = self.windows[layer]
        if window is not None:
            windowed = batch.window_mask(window)
            mask = windowed if mask is None else torch.minimum(mask, windowed)
        return batch.mask if mask is None else mask

    def record(
        self,
        batch: PackedBatch,
        layers: list[int] | None = None,
        masks: dict | None = None,
        keep: set[int] | None = None,
        until: int | None = None,
        read_only: bool = False,
    ) -> Pass:
        """Run the model's own decoder over `layers` (default all) on `batch` and record each
        layer's call, the hidden state entering the layers in `keep` (default all) and the final
        one. masks: {layer: additive mask [B, 1 or heads, T, T]} replacing the packed one there.
        until: a layer of `layers` after the first; it and the layers after it are not computed
        (the hidden state entering it is the last one recorded; their calls are still recorded,
        and `final` is None): what variants that all resume at or before it need, bit for bit.
        read_only: `final` is read by readout only, so the last layer runs read_rows_only."""
        layers = list(range(self.n_layers)) if layers is None else list(layers)
        skipped = layers[layers.index(until) :] if until is not None and until != layers[0] else []
        stale = set(skipped[1:])  # their entering state is not computed
        run = Pass(layers)
        handles = []
        shape = {}  # what a computed layer returns (a tensor, or a tuple led by it): a skipped one returns the same

        def keep_shape(module, args, kwargs, out):
            shape.setdefault("out", out)

        def passed_through(own_forward):
            hidden_name = next(iter(inspect.signature(own_forward).parameters))

            @functools.wraps(own_forward)  # the layer's signature, which LayerCall.bind reads
            def forward(*args, **kwargs):
                h = kwargs[hidden_name] if hidden_name in kwargs else args[0]
                out = shape.get("out")
                return (h, *out[1:]) if isinstance(out, tuple) else h

            return forward

        def recorder(original: int):
            def hook(module, args, kwargs):
                call, h = LayerCall.bind(module, args, kwargs)
                if "layer_idx" in call.kwargs:  # the loop's position; in a pruned view, the layer's own
                    call.kwargs["layer_idx"] = original  # (Zamba2's shared blocks pick adapters by it)
                if self.packs_choices:
                    call = call.with_mask(self._mask(batch, original, masks))
                run.calls[original] = call
                if (keep is None or original in keep) and original not in stale:
                    run.entering[original] = h
                return (), {call.hidden: h, **call.kwargs}

            return hook

        def final(module, args):
            run.final = args[0]

        kwargs = {"input_ids": batch.ids, "use_cache": False}
        if self.packs_choices:
            kwargs["attention_mask"] = batch.mask
        if self._takes_positions:
            kwargs["position_ids"] = batch.positions
        view = pruned_layers(self.model, layers) if layers != list(range(self.n_layers)) else contextlib.nullcontext()
        computed = layers[: len(layers) - len(skipped)]
        own = {}  # a skipped layer's own instance forward, if it had one
        try:
            with view:
                for original in layers:
                    handles.append(
                        self.layers[original].register_forward_pre_hook(recorder(original), with_kwargs=True)
                    )
                if skipped and computed:
                    handles.append(self.layers[computed[0]].register_forward_hook(keep_shape, with_kwargs=True))
                for original in skipped:
                    layer = self.layers[original]
                    own[original] = vars(layer).get("forward")
                    layer.forward = passed_through(layer.forward)
                handles.append(self.norm.register_forward_pre_hook(final))
                last = self.read_rows_only(layers[-1], batch) if read_only and not skipped else contextlib.nullcontext()
                with last:
                    self.base(**kwargs)
                work.add(batch.ids.numel(), len(computed), self.flops(batch.ids.shape, computed))
        finally:
            for handle in handles:
                handle.remove()
            for original, forward in own.items():
                if forward is None:
                    del self.layers[original].forward  # the class's own again
                else:
                    self.layers[original].forward = forward
        if skipped:
            run.final = None
        elif run.final is None:
            raise UnsupportedModel(f"{family_of(self.model)}: the final norm was not applied by the decoder")
        return run

    def run(
        self,
        h: torch.Tensor,
        run: Pass,
        layers: list[int],
        batch: PackedBatch | None = None,
        masks: dict | None = None,
        read_only: bool = False,
    ) -> torch.Tensor:
        """Call `layers` in order from the hidden state `h` with the arguments recorded in `run`;
        masks: {layer: additive mask} replacing the packed one of `batch` there, as record's do;
        read_only: the result is read by readout only, so the last layer runs read_rows_only."""
        work.add(h.shape[0] * h.shape[1], len(layers), self.flops(h.shape, layers))
        for i in layers:
            call = run.calls[i]
            if masks and i in masks:
                call = call.with_mask(self._mask(batch, i, masks))
            last = read_only and i == layers[-1]
            with self.read_rows_only(i, batch) if last else contextlib.nullcontext():
                h = call(self.layers[i], h)
        return h

    def flops(self, shape, layers: list[int]) -> float:
        """Useful FLOPs of `layers` on a batch of `shape` [B, T, …]: the linear layers at every
        position and causal attention (2 · T² · query width per sequence)."""
        b, t = int(shape[0]), int(shape[1])
        return float(sum(b * t * self.token_flops[i] + 2 * b * t * t * self.attention_width[i] for i in layers))

    def logprobs(self, hidden: torch.Tensor, normed: bool = False) -> torch.Tensor:
        """Log-softmax over the vocabulary of hidden states [N, d] (final norm unless `normed`)."""
        work.add_flops(2 * hidden.shape[0] * self.head.weight.numel())
        if not normed:
            hidden = self.norm(hidden)
        logits = self.head(hidden).float()
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return torch.log_softmax(logits, dim=-1)

    @staticmethod
    def read_positions(batch: PackedBatch) -> dict[tuple[int, int], int]:
        """{(row, position): index} of the positions readout reads, each once: every choice's first
        token is predicted at the same (last context) position, so projecting per (choice, token)
        would repeat the vocabulary matmul."""
        where: dict[tuple[int, int], int] = {}
        for b, item in enumerate(batch.items):
            for positions in item.score_at:
                for p in positions:
                    where.setdefault((b, p), len(where))
        return where

    @contextlib.contextmanager
    def read_rows_only(self, layer: int, batch: PackedBatch):
        """Within the block, the position-wise parts of `layer` (its MLP and attention output
        projections) compute only the positions readout reads, zeros elsewhere: the read-out of
        the layer's output is the full layer's up to the rounding of matmuls over fewer rows
        (tested); its other positions are not the layer's, so only a layer whose output nothing
        but the read-out reads may run so. Its query, key and value projections and attention
        still run at every position (every position is a key)."""
        parts = self.positionwise[layer]
        where = self.read_positions(batch)
        rows = torch.tensor([b for b, _ in where], device=batch.ids.device)
        cols = torch.tensor([p for _, p in where], device=batch.ids.device)
        own = {}

        def at_read_rows(module, forward):
            def restricted(x, *args, **kwargs):
                part = forward(x[rows, cols], *args, **kwargs)
                out = part.new_zeros(*x.shape[:-1], part.shape[-1])
                out[rows, cols] = part
                return out

            return restricted

        skipped = batch.ids.numel() - len(where)
        work.add_flops(-skipped * sum(work.linear_flops(m) for m in parts))  # not computed
        try:
            for module in parts:
                own[module] = vars(module).get("forward")
                module.forward = at_read_rows(module, module.forward)
            yield
        finally:
            for module, forward in own.items():
                if forward is None:
                    del module.forward
                else:
                    module.forward = forward

    def readout(self, h: torch.Tensor, batch: PackedBatch, normed: bool = False):
        """Per item: (summed log-prob per choice, greedy flag per choice), from the hidden state
        `h` after some layer (the final norm is applied here unless `normed`)."""
        where = self.read_positions(batch)
        rows = torch.tensor([b for b, _ in where], device=h.device)
        cols = torch.tensor([p for _, p in where], device=h.device)
        logp = self.logprobs(h[rows, cols], normed)
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
        """Differentiable log-prob of each item's target choice (summed over its tokens); an item
        holding one choice only (unpacked layout) is scored on that choice: pass 0."""
        rows, cols, toks, owner = [], [], [], []
        for b, (item, target) in enumerate(zip(batch.items, targets)):
            for p, t in zip(item.score_at[target], item.targets[target]):
                rows.append(b)
                cols.append(p)
                toks.append(t)
                owner.append(b)
        on = {"device": h.device}
        logp = self.logprobs(h[torch.tensor(rows, **on), torch.tensor(cols, **on)])
        picked = logp[torch.arange(len(toks), **on), torch.tensor(toks, **on)]
        return torch.zeros(len(batch.items), dtype=picked.dtype, **on).index_add(0, torch.tensor(owner, **on), picked)


@torch.inference_mode()
def reference_scores(model, context: list[int], choices: list[list[int]]) -> tuple[list[float], list[bool]]:
    """The reference: the model's own forward on context + choice, one choice at a time, logits
    everywhere; (summed log-prob per choice, greedy flag per choice)."""
    from gna.engine.device import device_of

    totals, greedy = [], []
    on = {"device": device_of(model)}
    # the head only where scored, when the model offers it (a 262k vocabulary over 500 positions is 0.5 GB)
    trims = "logits_to_keep" in inspect.signature(model.forward).parameters
    for cont in choices:
        ids = torch.tensor([context + cont[:-1]], **on)
        extra = {"logits_to_keep": len(cont)} if trims else {}
        logits = model(input_ids=ids, use_cache=False, **extra).logits[0, -len(cont) :]
        rows = torch.log_softmax(logits.float(), dim=-1)
        idx = torch.tensor(cont, **on)
        totals.append(float(rows[torch.arange(len(cont), **on), idx].sum()))
        greedy.append(bool((rows.argmax(-1) == idx).all()))
    return totals, greedy


_CHECKED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
CHECK_TOLERANCE = 1e-3
PROBE_MAX_TOKENS = 1100


@torch.inference_mode()
def check_engine(model) -> DecoderStack:
    """A DecoderStack for `model`, compared once per model with the model's own forward on a
    probe (two choices after a context longer than the smallest sliding window, up to
    PROBE_MAX_TOKENS), both the recorded pass and the layers called again from it: the
    family's read-out, masks and positions are then known to be the engine's. Raises
    UnsupportedModel naming the family and what differs."""
    stack = DecoderStack(model)
    if _CHECKED.get(model):
        return stack
    from gna.engine.device import device_of

    vocab = stack.head.weight.shape[0]
    windows = [w for w in stack.windows if w is not None]
    # past the smallest window where it is affordable (Gemma 3: 512), so a misread window shows
    length = min(min(windows, default=4) + 4, PROBE_MAX_TOKENS)
    gen = torch.Generator().manual_seed(0)
    context, first, second = (
        torch.randint(1, vocab, (n,), generator=gen, device="cpu").tolist() for n in (length, 3, 2)
    )
    choices = [first, second]
    dtype, device = next(model.parameters()).dtype, device_of(model)
    items = [pack(context, choices)] if stack.packs_choices else [pack(context, [c]) for c in choices]
    batch = collate(items, dtype, device)
    layers = list(range(stack.n_layers))
    with linears_in_full_precision(model):  # a structural check: both paths in the weights' dtype
        run = stack.record(batch, keep={0})
        engine = [t for totals, _ in stack.readout(run.final, batch) for t in totals]
        # the variants call the layers again with the recorded arguments: that path must agree too
        replayed = [t for totals, _ in stack.readout(stack.run(run.entering[0], run, layers), batch) for t in totals]
        reference = reference_scores(model, context, choices)[0]
    worst = max(abs(a - b) for a, b in zip(engine + replayed, reference + reference))
    scale = 1e-2 if dtype != torch.float32 else CHECK_TOLERANCE
    if not worst <= scale * max(1.0, max(abs(r) for r in reference)):
        raise UnsupportedModel(
            f"{family_of(model)} ({type(model).__name__}): the engine's log-probs differ from the model's own "
            f"forward by {worst:.3g} on a probe of {length} tokens — its attention masks, positions or output "
            "head work differently from what the engine supports (packed block masks, config sliding windows, "
            "final_logit_softcapping)"
        )
    _CHECKED[model] = True
    return stack
