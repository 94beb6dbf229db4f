"""Wall time, peak memory and work of a finished run, per study phase, from Snakemake's benchmark
records and the jobs' work counts (gna.core.work: layer-tokens, which do not depend on the CPU).

    .venv/bin/python benchmarks/phase_times.py [--benchmarks data/benchmarks] [--logs data/logs]
                                               [--phase students --target-min 20 --target-gb 6]

Prints one row per phase (gna.report.run_record.phase_timings: steps, summed wall seconds, largest
peak RSS, millions of layer-tokens and seconds per million: the machine's speed on this work) and,
with --phase, that phase's time and memory as ratios of the targets given.
"""

from __future__ import annotations

import argparse

from gna.report.run_record import phase_timings, timings, with_work


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--benchmarks", default="data/benchmarks")
    ap.add_argument("--logs", default="data/logs")
    ap.add_argument("--phase", default="students")
    ap.add_argument("--target-min", type=float, default=20.0)
    ap.add_argument("--target-gb", type=float, default=6.0)
    args = ap.parse_args()
    steps = with_work(timings(args.benchmarks), args.logs)
    if steps.is_empty():
        raise SystemExit(f"no benchmark records under {args.benchmarks}: run the workflow first")
    phases = phase_timings(steps)
    for row in phases.iter_rows(named=True):
        work = row["layer-tokens (M)"]
        speed = f"{row['seconds'] / work:6.1f} s per M" if work else "   (no count)"
        print(
            f"{row['phase']:<20} {row['steps']:>4} steps {row['seconds'] / 60:7.1f} min  "
            f"peak {row['peak RSS (MB)'] / 1024:5.2f} GB  {work:7.1f} M layer-tokens {speed}"
        )
    picked = phases.filter(phases["phase"] == args.phase)
    if not picked.is_empty():
        minutes, gb = picked["seconds"][0] / 60, picked["peak RSS (MB)"][0] / 1024
        print(
            f"{args.phase}: {minutes:.1f} min = {minutes / args.target_min:.2f}x the {args.target_min:g} min target; "
            f"peak {gb:.2f} GB = {gb / args.target_gb:.2f}x the {args.target_gb:g} GB target"
        )


if __name__ == "__main__":
    main()
