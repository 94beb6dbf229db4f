"""pytest plugin of benchmarks/gpu_check.py's tests part (`-p _failures`).

- Every test's phases (setup, call, teardown) are appended to the file GNA_TESTS_LOG as JSON lines
  the moment they end: outcome, seconds, and a failure's message. A run its time limit cuts off
  still says why each of its failures failed and how long each finished test took (pytest's own
  summary and JUnit file come only at the end).
- GNA_TEST_ALARM_S: a test (its fixtures included) still running after that many seconds fails
  with its name, instead of using up the part's time. Should the test hang inside C code, where
  Python's signal handler cannot run, faulthandler ends its process a little later, with every
  thread's stack on stderr (under pytest-xdist the controller then names the test its worker died in).
- Under pytest-xdist, the family matrix (tests/unit/models/test_families.py) goes to the workers
  one family at a time, so that each family's module fixture is built once, by one worker.
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal

import pytest

LOG_ENV = "GNA_TESTS_LOG"
ALARM_ENV = "GNA_TEST_ALARM_S"
HANG_GRACE_S = 30  # after the alarm, before faulthandler ends a process stuck in C code
# modules whose tests share a module fixture parametrized by their one parameter (the family)
BY_PARAMETER = ("tests/unit/models/test_families.py",)


def pytest_runtest_logreport(report) -> None:
    path = os.environ.get(LOG_ENV)
    if path:
        line = {"test": report.nodeid, "when": report.when, "outcome": report.outcome, "s": round(report.duration, 3)}
        if report.failed:
            line["text"] = str(report.longrepr)[-1500:]
        with open(path, "a") as out:
            out.write(json.dumps(line) + "\n")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """The per-test alarm around the test's setup, call and teardown (GNA_TEST_ALARM_S)."""
    seconds = int(os.environ.get(ALARM_ENV) or 0)
    if not seconds:
        yield
        return

    def ring(signum, frame):
        pytest.fail(f"{item.nodeid}: still running after {seconds} s (gpu_check's per-test alarm)", pytrace=False)

    previous = signal.signal(signal.SIGALRM, ring)
    signal.alarm(seconds)
    faulthandler.dump_traceback_later(seconds + HANG_GRACE_S, exit=True)
    try:
        yield
    finally:
        signal.alarm(0)
        faulthandler.cancel_dump_traceback_later()
        signal.signal(signal.SIGALRM, previous)


def scope(nodeid: str) -> str:
    """The unit of work a test belongs to under pytest-xdist: its family's, for a test of a
    BY_PARAMETER module; otherwise the test alone."""
    path, _, name = nodeid.partition("::")
    if path in BY_PARAMETER and name.endswith("]"):
        return f"{path}[{name.rsplit('[', 1)[1]}"
    return nodeid


# tryfirst: before tests/conftest.py's, which sends each family test on its own; optional: xdist may be absent
@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    class ByFamily(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return scope(nodeid)

    return ByFamily(config, log)


def _records(path: str) -> dict[tuple[str, str], dict]:
    """The log's records, once per test and phase (xdist's workers and controller both log them)."""
    seen: dict[tuple[str, str], dict] = {}
    if os.path.exists(path):
        for line in open(path):
            record = json.loads(line)
            seen.setdefault((record["test"], record["when"]), record)
    return seen


def read_failures(path: str) -> list[dict]:
    """The failures logged at `path`, once each per test and phase (a teardown error after a failed
    call is a second one)."""
    return [
        {"test": r["test"], "when": r["when"], "text": r.get("text", "")}
        for r in _records(path).values()
        if r["outcome"] == "failed"
    ]


def read_durations(path: str) -> list[dict]:
    """Each finished test's seconds (setup, call and teardown), slowest first. A test counts as
    finished once its teardown is logged: one cut off mid-way is not timed."""
    records = _records(path)
    finished = {test for test, when in records if when == "teardown"}
    seconds = {test: 0.0 for test in finished}
    for (test, _), record in records.items():
        if test in finished:
            seconds[test] += record["s"]
    return [{"test": t, "s": round(s, 2)} for t, s in sorted(seconds.items(), key=lambda ts: -ts[1])]
