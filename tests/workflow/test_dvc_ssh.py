"""The SSH DVC remote (README, "Sharing results") against a real OpenSSH server on localhost,
started by tests/cluster/local_sshd.sh: a small git + DVC project pushes through
`python -m gna.core.sharing push` to ssh://USER@127.0.0.1:PORT/..., the remote's objects are the
project's bytes, and a fresh clone pulls them back byte for byte. A wrong port, a key the server
refuses and a remote whose parent folder does not exist are named by the sharing code before DVC
runs, with what to check; a pull from an empty remote says where to push from. Needs sshd (installed with apt-get when
missing, as root); skipped elsewhere, and with GNA_SSH_TESTS=0."""

import getpass
import hashlib
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO

pytestmark = [pytest.mark.workflow, pytest.mark.slow]  # Snakemake, DVC, SSH: minutes
BIN = Path(sys.executable).parent
SCRIPT = REPO / "tests" / "cluster" / "local_sshd.sh"
STATE = Path(os.environ.get("GNA_SSHD_DIR", "/var/tmp/gna-sshd"))
USER = getpass.getuser()

# the stage the project runs: a folder out and a file out, with a nested file, a space in a name,
# non-ASCII text and incompressible random bytes (new ones on every run)
MAKE_DATA = """import os
from pathlib import Path
tables = Path("data/tables")
(tables / "nested").mkdir(parents=True, exist_ok=True)
(tables / "scores.csv").write_text("model,score\\ntiny,0.25\\nbig,0.75\\n")
(tables / "nested" / "notes é.txt").write_text("têtes: 3 → 1\\n")
(tables / "empty.txt").write_bytes(b"")
Path("data/blob.bin").write_bytes(os.urandom(300_000))
"""
DVC_YAML = """stages:
  make:
    cmd: python make_data.py
    deps: [make_data.py]
    outs: [data/tables, data/blob.bin]
"""


def env():
    return dict(
        os.environ,
        PATH=f"{BIN}:{os.environ['PATH']}",
        GIT_AUTHOR_NAME="t",
        GIT_AUTHOR_EMAIL="t@t",
        GIT_COMMITTER_NAME="t",
        GIT_COMMITTER_EMAIL="t@t",
    )


def run(cmd, cwd, ok=True):
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env=env(), timeout=120)
    assert (proc.returncode == 0) == ok, (
        f"{cmd} returned {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    )
    return proc.stdout + proc.stderr


def share(purpose, cwd, ok=True):
    return run([sys.executable, "-m", "gna.core.sharing", purpose], cwd, ok)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def why_no_sshd() -> str | None:
    if os.environ.get("GNA_SSH_TESTS") == "0":
        return "GNA_SSH_TESTS=0"
    if Path("/usr/sbin/sshd").exists() and shutil.which("ssh-keygen"):
        return None
    if os.geteuid() != 0:
        return "no /usr/sbin/sshd (or ssh-keygen), and installing openssh-server needs root"
    if not shutil.which("apt-get"):
        return "no /usr/sbin/sshd and no apt-get to install it"
    return None


@pytest.fixture(scope="module")
def sshd():
    """(port, client key) of an OpenSSH server on 127.0.0.1 that lets only this user in, with that key."""
    reason = why_no_sshd()
    if reason:
        pytest.skip(reason)
    port = free_port()
    script_env = dict(os.environ, GNA_SSHD_DIR=str(STATE), GNA_SSHD_PORT=str(port))
    start = time.perf_counter()
    proc = subprocess.run(["bash", str(SCRIPT), "start"], capture_output=True, text=True, env=script_env, timeout=600)
    assert proc.returncode == 0, f"local sshd did not start:\n{proc.stdout}\n{proc.stderr}"
    print(f"local sshd up in {time.perf_counter() - start:.1f}s: {proc.stderr.strip()}")
    try:
        yield port, STATE / "client_key"
    finally:
        subprocess.run(["bash", str(SCRIPT), "stop"], capture_output=True, text=True, env=script_env)


def make_project(root: Path) -> Path:
    """A git + DVC project whose one stage writes data/; reproduced and committed (dvc.lock too)."""
    root.mkdir()
    run(["git", "init", "-q"], root)
    run(["dvc", "init", "-q"], root)
    (root / "make_data.py").write_text(MAKE_DATA)
    (root / "dvc.yaml").write_text(DVC_YAML)
    run(["dvc", "repro", "-q"], root)
    run(["git", "add", "-A"], root)
    run(["git", "commit", "-qm", "data"], root)
    return root


def set_remote(project: Path, url: str, key: Path, local=False):
    """The remote `lab` as default (in .dvc/config, committed, unless local); the key in .dvc/config.local."""
    run(["dvc", "remote", "add", *(["--local"] if local else []), "-f", "-d", "lab", url], project)
    run(["dvc", "remote", "modify", "--local", "lab", "keyfile", str(key)], project)


def data_files(project: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(project)): p.read_bytes()
        for p in sorted((project / "data").rglob("*"))
        if p.is_file() and p.name != ".gitignore"
    }


def accepted_logins() -> int:
    return (STATE / "sshd.log").read_text(errors="replace").count(f"Accepted publickey for {USER} ")


def test_push_over_ssh_then_a_fresh_clone_pulls_the_same_bytes(tmp_path, sshd):
    port, key = sshd
    origin, clone, remote = tmp_path / "origin", tmp_path / "clone", tmp_path / "remote"
    make_project(origin)
    url = f"ssh://{USER}@127.0.0.1:{port}{remote}"
    shown = f"DVC remote 'lab' (ssh://127.0.0.1:{port}{remote})"
    set_remote(origin, url, key)
    run(["git", "commit", "-qam", "remote"], origin)  # the clone gets the URL; each machine sets its key
    originals = data_files(origin)
    assert len(originals) == 4 and len(originals["data/blob.bin"]) == 300_000

    # nothing there yet: a pull says so (the folder does not exist; its parent does)
    assert f"make pull: {shown} holds nothing yet" in share("pull", origin, ok=False)
    logins = accepted_logins()
    out = share("push", origin)
    assert f"pushed to {shown}: every tracked output of dvc.lock is there" in out
    assert accepted_logins() > logins  # through this sshd, with this key
    # the remote holds each file's bytes under its md5 (DVC's content-addressed layout)
    for name, content in originals.items():
        digest = hashlib.md5(content).hexdigest()
        assert (remote / "files" / "md5" / digest[:2] / digest[2:]).read_bytes() == content, name
    assert "Cache and remote 'lab' are in sync." in run(["dvc", "status", "--cloud"], origin)

    run(["git", "clone", "-q", str(origin), str(clone)], tmp_path)
    run(["dvc", "remote", "modify", "--local", "lab", "keyfile", str(key)], clone)
    assert data_files(clone) == {} and not (clone / ".dvc" / "cache").exists()
    out = share("pull", clone)
    assert f"pulled from {shown}: every tracked output of dvc.lock is there" in out
    pulled = data_files(clone)
    assert pulled.keys() == originals.keys()
    for name, content in originals.items():
        assert pulled[name] == content, f"{name} differs after the pull"
    assert "Data and pipelines are up to date." in run(["dvc", "status"], clone)


def test_an_unusable_ssh_remote_is_named_with_what_to_do(tmp_path, sshd):
    port, key = sshd
    project = make_project(tmp_path / "project")
    remote = tmp_path / "remote"

    # nothing listens there
    closed = free_port()
    set_remote(project, f"ssh://{USER}@127.0.0.1:{closed}{remote}", key, local=True)
    out = share("push", project, ok=False)
    assert f"make push: DVC remote 'lab' (ssh://127.0.0.1:{closed}{remote}) cannot be reached" in out
    assert f"ConnectionRefusedError: [Errno 111] Connect call failed ('127.0.0.1', {closed})" in out
    hint = "Check the host, port and user in the URL, and the key it logs in with"
    assert hint in out and "dvc remote modify --local lab keyfile PATH" in out

    # the server answers but refuses the key (its own host key is not an authorized client key)
    set_remote(project, f"ssh://{USER}@127.0.0.1:{port}{remote}", key.with_name("host_key"), local=True)
    out = share("push", project, ok=False)
    assert f"make push: DVC remote 'lab' (ssh://127.0.0.1:{port}{remote}) cannot be reached" in out
    assert f"PermissionError: Permission denied for user {USER} on host 127.0.0.1" in out and hint in out

    # a mistyped folder: its parent does not exist either, and a push creates neither
    typo = tmp_path / "no-such-folder" / "remote"
    set_remote(project, f"ssh://{USER}@127.0.0.1:{port}{typo}", key, local=True)
    for purpose in ("push", "pull"):
        out = share(purpose, project, ok=False)
        assert (
            f"make {purpose}: DVC remote 'lab' (ssh://127.0.0.1:{port}{typo}): its bucket or root does not exist" in out
        )
    assert not typo.parent.exists()

    # the folder exists but holds nothing: a machine without the data (no workspace copy, no
    # cache) is told that DVC could not pull and where the results must be pushed from
    remote.mkdir()
    set_remote(project, f"ssh://{USER}@127.0.0.1:{port}{remote}", key, local=True)
    shutil.rmtree(project / "data" / "tables")
    (project / "data" / "blob.bin").unlink()
    shutil.rmtree(project / ".dvc" / "cache")
    out = share("pull", project, ok=False)
    assert f"make pull: `dvc pull` from DVC remote 'lab' (ssh://127.0.0.1:{port}{remote}) failed" in out
    assert "run `make push` where the results were made" in out
    assert data_files(project) == {} and list(remote.iterdir()) == []
