"""One end-to-end distillation (KD) step: the output head and loss taken a slice of positions at a
time (gna.students.kd.kd_backward, the pipeline's path) against the reference, kd_loss on
the whole batch's logits then backward — time per step and peak memory, each path in its own
process (peak RSS only grows within a process), same student, same batches.

    .venv/bin/python benchmarks/distill_speed.py [--model-dir data/models/smollm2-135m] [--heads-kept 10]
        [--state-size 16] [--seq-len 256] [--batch 4] [--steps 4] [--threads 2]

Uses the prepared model and its distillation ranking where `make reproduce` made them (else a
tiny random Llama and random windows). Printed: seconds per step and peak RSS of both paths,
their ratios, and the largest relative difference of the SSM parameters' gradients on the first
batch.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import torch
from _common import model_or_tiny

from gna.engine.precision import COMPUTE_DTYPES, frozen_weights_in
from gna.students.kd import KDBatch, kd_backward, kd_loss
from gna.students.mixer import mixers
from gna.students.spec import make_hybrid


def student_and_batches(args):
    model, _, name = model_or_tiny(args.model_dir, args.threads)
    n_layers, n_heads = model.config.num_hidden_layers, model.config.num_attention_heads
    # the kept heads only decide which heads stay attention: spread them over the layers
    kept = [(i * n_layers // max(1, args.heads_kept), i % n_heads) for i in range(args.heads_kept)]
    student = make_hybrid(model, kept, args.state_size)
    student.requires_grad_(False)
    params = [p for m in mixers(student) for p in m.ssm_params()]
    for p in params:
        p.requires_grad_(True)
    gen = torch.Generator().manual_seed(0)
    vocab, k = model.config.vocab_size, 32
    shape = (args.steps, args.batch, args.seq_len)
    ids = torch.randint(0, vocab, shape, generator=gen)
    target = torch.softmax(torch.randn(*shape, k, generator=gen), -1)
    top_idx = torch.randint(0, vocab, (*shape, k), generator=gen)
    weights = 1 + 9 * (torch.rand(shape, generator=gen) < 0.05).float()
    return student, params, name, (ids, target, top_idx, weights)


def sliced_backward(student, ids, target, top_idx, weights, low) -> float:
    """The pipeline's path: kd_backward on the batch (KDBatch)."""
    return kd_backward(student, KDBatch(ids, target, top_idx, weights), low)


def reference_backward(student, ids, target, top_idx, weights, low) -> float:
    with torch.autocast(ids.device.type, dtype=torch.bfloat16, enabled=low is not None):
        logits = student(input_ids=ids, use_cache=False).logits
    loss = kd_loss(logits, target, top_idx, weights)
    loss.backward()
    return loss.item()


def run_path(args) -> dict:
    """Time `args.path` over the batches (the first one a warm-up); returns its timing, peak RSS
    and the gradients of the first batch."""
    student, params, name, (ids, target, top_idx, weights) = student_and_batches(args)
    low = COMPUTE_DTYPES[args.compute_dtype]
    step = sliced_backward if args.path == "sliced" else reference_backward
    times, first = [], None
    with frozen_weights_in(student, low):
        for i in range(args.steps):
            for p in params:
                p.grad = None
            start = time.perf_counter()
            step(student, ids[i], target[i], top_idx[i], weights[i], low)
            times.append(time.perf_counter() - start)
            if first is None:
                first = torch.cat([p.grad.flatten() for p in params])
    torch.save(first, args.grads)
    return {
        "model": name,
        "s_per_step": sum(times[1:]) / max(1, len(times) - 1),
        "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", default="data/models/smollm2-135m")
    parser.add_argument("--heads-kept", type=int, default=10)
    parser.add_argument("--state-size", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--compute-dtype", default="bfloat16", choices=sorted(COMPUTE_DTYPES))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default="benchmarks/out/distill.json")
    parser.add_argument("--path", choices=["sliced", "reference"], help=argparse.SUPPRESS)  # one child process
    parser.add_argument("--grads", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.path:
        print(json.dumps(run_path(args)))
        return
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    results = {}
    for path in ("reference", "sliced"):
        grads = out.with_name(f".distill-grads-{path}.pt")
        child = subprocess.run(
            [sys.executable, __file__, *sys.argv[1:], "--path", path, "--grads", str(grads)],
            check=True,
            capture_output=True,
            text=True,
        )
        results[path] = json.loads(child.stdout.strip().splitlines()[-1])
        results[path]["grads"] = torch.load(grads)
        grads.unlink()
    ref, fast = results["reference"], results["sliced"]
    rel = float((fast.pop("grads") - ref["grads"]).abs().max() / ref.pop("grads").abs().max())
    summary = {
        "model": ref["model"],
        "reference": ref,
        "sliced": fast,
        "time_ratio": ref["s_per_step"] / fast["s_per_step"],
        "memory_ratio": fast["peak_rss_gb"] / ref["peak_rss_gb"],
        "max_rel_grad_diff": rel,
    }
    print(
        f"{ref['model']}, KD step of {args.batch} x {args.seq_len} tokens ({args.compute_dtype}, {args.threads} "
        "threads): "
        f"reference {ref['s_per_step']:.2f} s, peak {ref['peak_rss_gb']:.2f} GB; sliced head "
        f"{fast['s_per_step']:.2f} s, "
        f"peak {fast['peak_rss_gb']:.2f} GB -> {summary['time_ratio']:.2f}x faster, "
        f"{summary['memory_ratio']:.2f}x the memory; max relative gradient difference {rel:.1e}"
    )
    out.write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
