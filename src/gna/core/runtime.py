"""Process set-up shared by every workflow script: logging to the rule's log, torch threads."""

from __future__ import annotations

import logging
import resource
import sys


def setup(log_path: str | None, threads: int = 1) -> logging.Logger:
    """Send stderr (progress bars, warnings, tracebacks) to the rule's log file and pin torch
    to the rule's thread count, so Snakemake's core accounting matches reality."""
    if log_path:
        stream = open(log_path, "w", buffering=1)
        sys.stderr = stream
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, force=True,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    import torch

    torch.set_num_threads(max(1, int(threads)))
    log = logging.getLogger("gna")
    log.info("torch threads: %d", torch.get_num_threads())
    return log


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
