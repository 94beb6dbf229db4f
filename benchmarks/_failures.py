"""pytest plugin of benchmarks/gpu_check.py: each failed test's id and message appended to the
file GNA_FAILURES_LOG as one JSON line the moment it fails, so a run its time limit cuts off still
says why each of its failures failed (pytest's own summary comes only at the end)."""

from __future__ import annotations

import json
import os


def pytest_runtest_logreport(report) -> None:
    path = os.environ.get("GNA_FAILURES_LOG")
    if path and report.failed:
        line = {"test": report.nodeid, "when": report.when, "text": str(report.longrepr)[-1500:]}
        with open(path, "a") as out:
            out.write(json.dumps(line) + "\n")


def read_failures(path: str) -> list[dict]:
    """The failures logged at `path`, once each per test and phase (xdist's workers and controller
    both log them; a teardown error after a failed call is a second one)."""
    seen: dict[tuple[str, str], dict] = {}
    if os.path.exists(path):
        for line in open(path):
            record = json.loads(line)
            seen.setdefault((record["test"], record["when"]), record)
    return list(seen.values())
