"""Process set-up shared by every workflow script: logging to the rule's log, torch threads."""

from __future__ import annotations

import atexit
import logging
import resource
import sys

from gna.core import work
from gna.core.guard import record_written


def work_path(log_path: str) -> str:
    """Where a job's work count goes: beside its log, `<log without .log>.work.json`."""
    return log_path.removesuffix(".log") + ".work.json"


def record_on_success(outputs) -> None:
    """When the process ends without an uncaught exception, record the md5 of every file of
    `outputs` as written by the pipeline (gna.core.guard)."""
    failed = []
    previous = sys.excepthook

    def hook(*exc_info):
        failed.append(exc_info[0])
        previous(*exc_info)

    sys.excepthook = hook
    atexit.register(lambda: failed or record_written([str(o) for o in outputs]))


def setup(log_path: str | None, threads: int = 1, outputs=None) -> logging.Logger:
    """Send stderr (progress bars, warnings, tracebacks) to the rule's log file and pin torch
    to the rule's thread count, so Snakemake's core accounting matches reality. `outputs` (the
    job's output files): recorded as the pipeline's when the job succeeds (record_on_success)."""
    if outputs is not None:
        record_on_success(outputs)
    if log_path:  # the job's work count beside its log (gna.core.work), read by the run record
        atexit.register(lambda: work.layer_tokens() and work.write_work(work_path(log_path)))
    if log_path:
        stream = open(log_path, "w", buffering=1)
        sys.stderr = stream
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, force=True, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    import torch

    torch.set_num_threads(max(1, int(threads)))
    log = logging.getLogger("gna")
    log.info("torch threads: %d", torch.get_num_threads())
    return log


def run_rule(smk, run, settings_type):
    """A workflow script's one call: set the job up (setup: the rule's first log, its threads,
    its outputs recorded on success) and call `run(inputs, outputs, settings)` with the rule's
    files (gna.core.settings.Files; its logs named other than `log` join the outputs: records
    beside the log) and `settings_type.of(params.settings)` (a RuleSettings class; a `memory_mb`
    field gets the job's mem_mb resource, which params would make a rerun trigger)."""
    from gna.core.settings import Files

    logs = dict(smk.log.items()) if smk.log else {}
    setup(smk.log[0] if smk.log else None, smk.threads, outputs=smk.output)
    outputs = Files.of({**dict(smk.output.items()), **{k: v for k, v in logs.items() if k != "log"}})
    values = dict(getattr(smk.params, "settings", None) or {})
    if "memory_mb" in settings_type.__dataclass_fields__:  # the job's memory: a resource, never a rerun trigger
        values["memory_mb"] = getattr(smk.resources, "mem_mb", None)
    settings = settings_type.of(values)
    return run(Files.of(dict(smk.input.items())), outputs, settings)


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
