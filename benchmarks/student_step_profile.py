"""Where a student's training step spends its time: the share in matrix products against the
elementwise work around them (the scan, its decays, norms, casts), for one alignment step and one
KD step of the pipeline's own code, by the torch profiler's self time per operator.

    .venv/bin/python benchmarks/student_step_profile.py [--model-dir data/models/smollm2-135m]
        [--state-size 16] [--heads-kept 10] [--seq-len 256] [--batch 4] [--compute-dtype bfloat16]
        [--align-steps 4] [--threads 2]

Uses the prepared model where `make reproduce` made it (else a tiny random Llama; `--shapes-only`:
random weights of its config.json's shapes, for a machine without the weights) and random
windows (the time does not depend on the tokens); alignment's step is the difference between
1 + `--align-steps` steps and 1, per step: its set-up, once per state size, cancels out.
`--compute-dtype bfloat16` is the default config's;
on a CPU without bf16 instructions both stages train in float32 instead (gna.engine.precision.
training_dtype), as the pipeline does. Printed and returned as JSON: per stage the seconds per step
(after a warm-up), the useful GFLOP/s (gna.core.work's count, as the run
record's), the share of operator self time in matrix products, and the five operators that take
the most. A share far below one on a host with fast matrix units (AMX) says the step is bound by
its elementwise work, which only fusing it cuts.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from _common import model_or_tiny
from torch.profiler import ProfilerActivity, profile

from gna.core import work
from gna.engine.precision import COMPUTE_DTYPES, frozen_weights_in, training_dtype
from gna.models.tiny import shaped_random_model
from gna.students.alignment import Align, align_layers
from gna.students.kd import KDBatch, kd_backward
from gna.students.mixer import mixers
from gna.students.spec import make_hybrid

MATMUL = {"aten::mm", "aten::bmm", "aten::addmm", "aten::baddbmm", "aten::_scaled_dot_product_flash_attention_for_cpu"}


def _measured(step) -> tuple[float, float, dict]:
    """(seconds, useful FLOPs, {operator: self time}) of `step`: timed on its own (the profiler
    adds a cost to every operator, and a step runs thousands of small ones), then profiled."""
    work.reset()
    start = time.perf_counter()
    step()
    seconds, flops = time.perf_counter() - start, work.useful_flops()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step()
    return seconds, flops, {e.key: e.self_cpu_time_total for e in prof.key_averages()}


def profiled(step, more=None, steps: int = 1) -> dict:
    """Profile `step` after a warm-up call: its seconds, useful GFLOP/s, matmul share of operator
    self time and top operators. With `more` (the same work plus `steps` more steps), what those
    steps add, per step: the steady state without the set-up both share."""
    step()
    seconds, flops, ops = _measured(step)
    if more is not None:
        longer, more_flops, more_ops = _measured(more)
        seconds, flops = (longer - seconds) / steps, (more_flops - flops) / steps
        ops = {k: max(0.0, v - ops.get(k, 0.0)) / steps for k, v in more_ops.items()}
    total = sum(ops.values()) or 1.0
    top = sorted(ops.items(), key=lambda kv: -kv[1])[:5]
    return {
        "seconds": round(seconds, 3),
        "GFLOP/s": round(flops / seconds / 1e9, 1),
        "matmul share": round(sum(v for k, v in ops.items() if k in MATMUL) / total, 3),
        "top operators": {k: round(v / total, 3) for k, v in top},
    }


def main() -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-dir", default="data/models/smollm2-135m")
    ap.add_argument("--state-size", type=int, default=16)
    ap.add_argument("--heads-kept", type=int, default=10)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--compute-dtype", default="bfloat16", choices=sorted(COMPUTE_DTYPES))
    ap.add_argument("--align-steps", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--shapes-only", action="store_true", help="random weights of the model's config.json")
    args = ap.parse_args()
    if args.shapes_only:
        torch.set_num_threads(args.threads)
        layers = json.loads(Path(args.model_dir, "config.json").read_text())["num_hidden_layers"]
        model, name = shaped_random_model(args.model_dir, layers), f"{Path(args.model_dir).name} (random weights)"
    else:
        model, _, name = model_or_tiny(args.model_dir, args.threads)
    model.float().eval()
    cfg = model.config
    dtype = training_dtype(torch.device("cpu"), args.compute_dtype, "benchmark")
    gen = torch.Generator().manual_seed(0)
    shape = (args.batch, args.seq_len)
    hidden = torch.randn(cfg.num_hidden_layers, args.batch, args.seq_len, cfg.hidden_size, generator=gen) * 0.5
    result = {"model": name, "threads": args.threads, "compute dtype": dtype}
    result["tokens per step"] = args.batch * args.seq_len

    def aligned(steps):  # alignment of every layer
        align = Align(steps=steps, batch=args.batch, compute_dtype=dtype)
        return lambda: align_layers(model, hidden, args.state_size, align, seed=0, progress=False)

    result["alignment"] = profiled(aligned(1), aligned(1 + args.align_steps), steps=args.align_steps)
    n_layers, n_heads = cfg.num_hidden_layers, cfg.num_attention_heads
    kept = [(i * n_layers // max(1, args.heads_kept), i % n_heads) for i in range(args.heads_kept)]
    student = make_hybrid(model, kept, args.state_size).requires_grad_(False)
    for p in (p for m in mixers(student) for p in m.ssm_params()):
        p.requires_grad_(True)
    k = 32
    batch = KDBatch(
        torch.randint(0, cfg.vocab_size, shape, generator=gen),
        torch.softmax(torch.randn(*shape, k, generator=gen), -1),
        torch.randint(0, cfg.vocab_size, (*shape, k), generator=gen),
        torch.ones(shape),
    )
    low = COMPUTE_DTYPES[dtype]
    with frozen_weights_in(student, low):
        result["kd"] = profiled(lambda: kd_backward(student, batch, low))
    print(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
