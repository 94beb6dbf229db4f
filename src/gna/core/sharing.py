"""Sharing results through DVC: the folders DVC tracks, and a remote that fails loudly.

DVC tracks the study's results per phase (the outs of dvc.yaml's stage). `make pull` / `make
push` check the default remote first (check_remote), because DVC itself reports a missing
remote as "Everything is up to date" or creates a missing local folder and reports success.
"""

from __future__ import annotations

import json
import posixpath
import subprocess
import sys
from pathlib import Path

import yaml

# what a run writes under data/ that describes the machine and the run, not the results: logs,
# Snakemake's benchmark records, the run record (gna.report.run_record). Never tracked by DVC.
UNTRACKED = ("data/logs", "data/benchmarks", "data/run")


def tracked_outs(dvc_yaml: str | Path) -> list[str]:
    """The outs of every stage of `dvc_yaml`, as paths relative to its folder."""
    outs = []
    for stage in yaml.safe_load(Path(dvc_yaml).read_text())["stages"].values():
        outs += [next(iter(out)) if isinstance(out, dict) else out for out in stage.get("outs", [])]
    return outs


def ensure_tracked_folders(dvc_yaml: str | Path, root: str | Path = ".") -> list[Path]:
    """Create (empty) every folder out of `dvc_yaml` missing under `root`; return those created.
    DVC refuses a missing out, and a config may leave a phase out (no students, no downloaded
    sources); a path with a file suffix is a file out and left alone."""
    created = []
    for out in tracked_outs(dvc_yaml):
        path = Path(root) / out
        if not path.suffix and not path.exists():
            path.mkdir(parents=True)
            created.append(path)
    return created


OBJECT_STORES = ("s3", "gs", "azure", "oss")


class RemoteError(RuntimeError):
    """The DVC remote cannot be used as asked; the message says what to configure."""


HOW_TO_CONFIGURE = """Configure the remote your lab shares results through (README, "Sharing results"), e.g.
  dvc remote add -d lab s3://BUCKET/gna                       # S3 (or S3-compatible: also
  dvc remote modify lab endpointurl https://s3.example.org    #   its endpoint; keys from the
                                                              #   usual AWS variables or files)
  dvc remote add -d lab ssh://HOST/srv/gna                    # SSH (dvc-ssh is installed with the project)
  dvc remote add -d lab /mnt/shared/gna                       # a folder every machine mounts
(add --local to keep it out of git, in .dvc/config.local)"""


def default_remote(repo_dir: str | Path = "."):
    """The project's default DVC remote (dvc.data_cloud.Remote), or RemoteError saying how to add one."""
    from dvc.repo import Repo

    repo = Repo(str(repo_dir))
    name = repo.config["core"].get("remote")
    if not name:
        raise RemoteError(
            f"no DVC remote is configured for this project ({Path(repo_dir).resolve()}).\n" + HOW_TO_CONFIGURE
        )
    return repo.cloud.get_remote(name)


def describe(remote) -> str:
    return f"DVC remote '{remote.name}' ({remote.fs.unstrip_protocol(remote.path)})"


def check_remote(repo_dir: str | Path, purpose: str):
    """Check that the default remote can be used to `purpose` ('pull' or 'push') before DVC runs:
    a local folder must exist (DVC would create a mistyped one on push and call it a success, and
    call a missing one "up to date" on pull); a network remote must answer, and hold something to
    pull. Returns the remote; raises RemoteError naming it and what to do."""
    if purpose not in ("pull", "push"):
        raise ValueError(f"purpose must be 'pull' or 'push', not {purpose!r}")
    remote = default_remote(repo_dir)
    fs, path = remote.fs, remote.path
    try:
        exists = fs.exists(path)
        # an object store has no folders (a prefix exists once something is stored under it): its
        # bucket must exist; elsewhere the folder's parent
        root = path.split("/", 1)[0] if fs.protocol in OBJECT_STORES else posixpath.dirname(path.rstrip("/"))
        root_exists = exists or fs.protocol == "local" or fs.exists(root)
    except Exception as error:  # any transport error: unreachable host, refused, bad credentials
        check = (
            f"Check the host, port and user in the URL, and the key it logs in with (~/.ssh/config, "
            f"an ssh-agent, or: dvc remote modify --local {remote.name} keyfile PATH)."
            if fs.protocol == "ssh"
            else "Check the URL, the endpoint and the credentials."
        )
        raise RemoteError(
            f"{describe(remote)} cannot be reached: {type(error).__name__}: {error}\n" + check + "\n" + HOW_TO_CONFIGURE
        ) from error
    if fs.protocol == "local" and not exists:
        action = (
            "results pushed there on another machine are not here"
            if purpose == "pull"
            else f"`make push` does not create it (a mistyped path would keep results where nobody looks); "
            f"create it first (mkdir -p {path}) if that is the place"
        )
        raise RemoteError(f"{describe(remote)} does not exist on this machine: {action}.\n" + HOW_TO_CONFIGURE)
    if not root_exists:
        raise RemoteError(
            f"{describe(remote)}: its bucket or root does not exist; create it or fix the URL.\n" + HOW_TO_CONFIGURE
        )
    if purpose == "pull" and not exists:
        raise RemoteError(
            f"{describe(remote)} holds nothing yet: run `make push` where the results were made, "
            "or configure the remote that holds them.\n" + HOW_TO_CONFIGURE
        )
    return remote


def _dvc(repo_dir: str | Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dvc", *args], cwd=repo_dir, capture_output=True, text=True)


def missing_on_remote(repo_dir: str | Path) -> list[str]:
    """Tracked outputs of dvc.lock that the default remote lacks (`dvc status --cloud`)."""
    proc = _dvc(repo_dir, "status", "--cloud", "--json")
    if proc.returncode != 0:
        raise RemoteError(f"`dvc status --cloud` failed:\n{proc.stderr.strip()[-2000:]}")
    status = json.loads(proc.stdout or "{}")
    return sorted(path for path, state in status.items() if state in ("new", "deleted", "missing"))


def share(repo_dir: str | Path, purpose: str) -> str:
    """`make pull` / `make push`: check_remote, run `dvc pull` / `dvc push`, then check that the
    remote holds every tracked output (push) or that the workspace has them (pull). Returns a
    one-line summary; raises RemoteError saying what went wrong and what to do."""
    remote = check_remote(repo_dir, purpose)
    proc = _dvc(repo_dir, purpose)
    if proc.returncode != 0:
        raise RemoteError(
            f"`dvc {purpose}` from {describe(remote)} failed:\n{(proc.stdout + proc.stderr).strip()[-3000:]}"
            + (
                "\nIf files are missing there, run `make push` where the results were made."
                if purpose == "pull"
                else ""
            )
        )
    missing = missing_on_remote(repo_dir)
    if purpose == "push" and missing:
        raise RemoteError(f"after `dvc push`, {describe(remote)} still lacks: {', '.join(missing)}")
    if purpose == "pull":
        status = _dvc(repo_dir, "status", "--quiet")
        if status.returncode != 0:
            raise RemoteError(
                f"after `dvc pull` from {describe(remote)} the workspace differs from dvc.lock:\n"
                + _dvc(repo_dir, "status").stdout.strip()[-3000:]
            )
    verb = "pushed to" if purpose == "push" else "pulled from"
    return f"{verb} {describe(remote)}: every tracked output of dvc.lock is there"


def main(argv: list[str] | None = None) -> int:
    """python -m gna.core.sharing pull|push [REPO_DIR]"""
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in ("pull", "push"):
        print("usage: python -m gna.core.sharing pull|push [REPO_DIR]", file=sys.stderr)
        return 2
    try:
        print(share(argv[1] if len(argv) > 1 else ".", argv[0]))
    except RemoteError as error:
        print(f"make {argv[0]}: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
