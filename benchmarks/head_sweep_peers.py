"""The per-head ablation sweep in gna against the same sweep written with the tools researchers use.

    make peers    # TransformerLens and nnsight from PyPI into .peers/ (the project's lock is untouched)
    PYTHONPATH=.peers .venv/bin/python benchmarks/head_sweep_peers.py [--model-dir data/models/smollm2-135m]
        [--prompts 32] [--layers 0,10,20,29] [--threads 2]

Same prompts (the default config's sweep: KV retrieval, 32 prompts, 10 keys), same token ids, same
heads, same scoring (summed log-prob of each choice, prediction = argmax, mean log-prob of the
correct choice). The peers are written as a researcher would: per prompt, one batch of its
choice sequences (context + choice, right-padded), a forward with one head zeroed, the
log-softmax read at the choice positions:

- TransformerLens (TransformerBridge over the same HF checkpoint): a hook on
  `blocks.{L}.attn.hook_z` that zeroes head H;
- nnsight (LanguageModel over the same HF checkpoint): `o_proj.input[..., H*d:(H+1)*d] = 0`
  inside a trace.

gna sweeps every head of `--layers` (the exact prefix-reusing sweep as heads_sweep runs it at
eval.compute_dtype: float32: choices packed into one sequence, layers before L run once per
batch, the linear layers through oneDNN's float32 kernel on a CPU); each peer ablates one head per layer in
`--layers`. Printed: seconds per head, the time extrapolated to every head of the model (a
peer's cost is the same for every head; gna's grows with the layers after the head, so its
extrapolation weights each layer by the layers it reruns), the ratio peer/gna, and the largest
|Δ mean log-prob| between each peer and gna over the common heads and the unablated model.
"""

from __future__ import annotations

import argparse
import json
import time
from importlib.metadata import version
from pathlib import Path

import torch
from _common import extrapolated_fast_sweep_s

from gna.engine.anatomy import all_heads, decoder_layers, head_sites, heads_per_layer
from gna.engine.scoring import Scorer, encode_table
from gna.models.prepare import load_model
from gna.phases.head_ablation import sweep_heads
from gna.tasks.tables import build_kv_retrieval

AGREEMENT = 1e-4  # max |Δ mean log-prob| allowed between a peer and gna


def choice_batches(encoded) -> list[tuple[torch.Tensor, list[list[int]], int]]:
    """Per prompt: its choice sequences right-padded into one batch (padding only follows the
    positions read, so a causal model needs no mask), the choices, the context length."""
    batches = []
    for e in encoded:
        seqs = [e.context + ch[:-1] for ch in e.choices]
        width = max(map(len, seqs))
        ids = torch.tensor([s + [0] * (width - len(s)) for s in seqs])
        batches.append((ids, e.choices, len(e.context)))
    return batches


def score_logits(logits: torch.Tensor, choices: list[list[int]], n_context: int) -> list[float]:
    """Summed log-prob of each choice from its row of logits."""
    totals = []
    for row, ch in enumerate(choices):
        rows = torch.log_softmax(logits[row, n_context - 1 : n_context - 1 + len(ch)].float(), dim=-1)
        totals.append(float(rows[torch.arange(len(ch)), torch.tensor(ch)].sum()))
    return totals


def summarize_items(totals: list[list[float]], targets: list[int]) -> dict:
    preds = [max(range(len(t)), key=t.__getitem__) for t in totals]
    return {
        "acc": sum(p == y for p, y in zip(preds, targets)) / len(targets),
        "mean_logp": sum(t[y] for t, y in zip(totals, targets)) / len(targets),
    }


def transformer_lens_sweep(model_dir: str, tok, batches, targets, heads) -> tuple[dict, float]:
    """TransformerLens: {(layer, head): acc, mean_logp} and the sweep's seconds (loading excluded)."""
    from transformer_lens.model_bridge import TransformerBridge

    bridge = TransformerBridge.boot_transformers(model_dir, tokenizer=tok, device="cpu", dtype=torch.float32)
    bridge.eval()

    def zero_head(head):
        def hook(z, hook):  # hook_z: [batch, pos, head, d_head] (or heads flattened into the last dim)
            if z.dim() == 4:
                z[:, :, head] = 0.0
            else:
                d = z.shape[-1] // bridge.cfg.n_heads
                z[..., head * d : (head + 1) * d] = 0.0
            return z

        return hook

    def run(hooks):
        with torch.inference_mode():
            totals = [score_logits(bridge.run_with_hooks(ids, fwd_hooks=hooks), ch, n) for ids, ch, n in batches]
        return summarize_items(totals, targets)

    start = time.perf_counter()
    scores = {(-1, -1): run([])} | {
        (layer, head): run([(f"blocks.{layer}.attn.hook_z", zero_head(head))]) for layer, head in heads
    }
    return scores, time.perf_counter() - start


def nnsight_sweep(model_dir: str, tok, batches, targets, heads) -> tuple[dict, float]:
    """nnsight: {(layer, head): acc, mean_logp} and the sweep's seconds (loading excluded)."""
    from nnsight import TransformersModel

    hf_model, _ = load_model(model_dir)
    lm = TransformersModel(hf_model, task="text-generation", tokenizer=tok)
    d = hf_model.config.hidden_size // hf_model.config.num_attention_heads
    d = getattr(hf_model.config, "head_dim", None) or d

    def run(layer, head):
        totals = []
        with torch.inference_mode():
            for ids, ch, n in batches:
                with lm.trace(ids):
                    if layer >= 0:
                        lm.model.layers[layer].self_attn.o_proj.input[..., head * d : (head + 1) * d] = 0.0
                    logits = lm.output.logits.save()
                totals.append(score_logits(logits, ch, n))
        return summarize_items(totals, targets)

    start = time.perf_counter()
    scores = {(-1, -1): run(-1, -1)} | {(layer, head): run(layer, head) for layer, head in heads}
    return scores, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", default="data/models/smollm2-135m")
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--dict-size", type=int, default=10)
    parser.add_argument("--layers", default="0,10,20,29", help="gna sweeps all their heads, each peer one per layer")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default="benchmarks/out/head_sweep_peers.json")
    args = parser.parse_args()
    if not Path(args.model_dir, "config.json").exists():
        raise SystemExit(f"{args.model_dir}: no prepared model (run `snakemake --cores 2 {args.model_dir}` first)")
    torch.set_num_threads(args.threads)
    model, tok = load_model(args.model_dir, compute_dtype="float32")  # as heads_sweep at eval.compute_dtype: float32
    per_layer = heads_per_layer(head_sites(model))
    n_layers, n_heads = len(decoder_layers(model)), len(all_heads(model))
    layers = [int(x) for x in args.layers.split(",")]
    if not set(layers) <= set(per_layer):
        raise SystemExit(f"--layers {args.layers}: the model has layers 0..{n_layers - 1}")
    table = build_kv_retrieval([args.dict_size], args.prompts, seed=4321, template="lookup")
    targets = table["target"].to_list()
    batches = choice_batches(encode_table(tok, table))
    gna_heads = [(layer, h) for layer, h in all_heads(model) if layer in layers]
    peer_heads = [(layer, layer % per_layer[layer]) for layer in layers]
    print(
        f"{Path(args.model_dir).name}: {n_layers} layers, {n_heads} heads; {len(table)} KV prompts "
        f"(size {args.dict_size}); {args.threads} threads; gna sweeps {len(gna_heads)} heads, "
        f"each peer {len(peer_heads)}"
    )

    start = time.perf_counter()
    ours = sweep_heads(Scorer(model, tok, progress=False), table, heads=gna_heads)
    t_gna = time.perf_counter() - start
    gna_all_s = extrapolated_fast_sweep_s(t_gna, gna_heads, per_layer)
    gna_scores = {(r["layer"], r["head"]): r for r in ours.iter_rows(named=True)}
    result = {
        "model": Path(args.model_dir).name,
        "prompts": len(table),
        "threads": args.threads,
        "heads_total": n_heads,
        "gna": {
            "heads": len(gna_heads),
            "seconds": t_gna,
            "s_per_head": t_gna / len(gna_heads),
            "all_heads_s": gna_all_s,
        },
    }
    print(f"gna              : {t_gna / len(gna_heads):6.2f} s/head; all {n_heads} heads ~{gna_all_s:7.0f} s")

    peers = {"TransformerLens": ("transformer-lens", transformer_lens_sweep), "nnsight": ("nnsight", nnsight_sweep)}
    for name, (dist, sweep) in peers.items():
        scores, t_peer = sweep(args.model_dir, tok, batches, targets, peer_heads)
        per_head = t_peer / (len(peer_heads) + 1)  # the unablated run costs one head's forward
        worst = max(abs(s["mean_logp"] - gna_scores[key]["mean_logp"]) for key, s in scores.items())
        same_acc = all(s["acc"] == gna_scores[key]["acc"] for key, s in scores.items())
        result[name] = {
            "version": version(dist),
            "heads": len(peer_heads),
            "seconds": t_peer,
            "s_per_head": per_head,
            "all_heads_s": per_head * n_heads,
            "ratio_vs_gna": per_head * n_heads / gna_all_s,
            "max_abs_mean_logp_diff": worst,
            "same_accuracy": same_acc,
        }
        print(
            f"{name:16s} {version(dist):>7s}: {per_head:6.2f} s/head; all {n_heads} heads ~{per_head * n_heads:7.0f} "
            "s; "
            f"{per_head * n_heads / gna_all_s:5.1f}x gna's time; max|Δ mean logp| vs gna {worst:.1e}, "
            f"accuracies {'equal' if same_acc else 'DIFFER'}"
        )
        if worst > AGREEMENT or not same_acc:
            raise SystemExit(f"{name} and gna disagree (max |Δ mean logp| {worst:.1e} > {AGREEMENT:.0e} or accuracy)")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
