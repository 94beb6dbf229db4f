"""DVC sharing: the tracked folders of dvc.yaml (every phase's results, nothing that describes the
machine), and empty folders for phases a config leaves out."""

import subprocess
import sys

import pytest
from conftest import REPO

from gna.core.sharing import UNTRACKED, RemoteError, check_remote, ensure_tracked_folders, tracked_outs
from gna.report.run_record import RUN_RECORD


def test_dvc_tracks_each_phase_and_nothing_that_describes_the_run():
    outs = tracked_outs(REPO / "dvc.yaml")
    assert {"data/models", "data/results/heads", "data/distill", "data/report"} <= set(outs)
    assert all(out.startswith("data/") for out in outs) and len(outs) == len(set(outs))
    assert not [out for out in outs for untracked in UNTRACKED if out.startswith(untracked)]
    assert any(RUN_RECORD.startswith(untracked + "/") for untracked in UNTRACKED)


def test_missing_phase_folders_are_created_empty_and_file_outs_left_alone(tmp_path):
    (tmp_path / "dvc.yaml").write_text(
        "stages:\n  s:\n    cmd: x\n    outs:\n      - data/a:\n          persist: true\n      - data/b\n"
        "      - data/c.parquet:\n          persist: true\n"
    )
    (tmp_path / "data/a").mkdir(parents=True)
    (tmp_path / "data/a/x").write_text("kept")
    assert ensure_tracked_folders(tmp_path / "dvc.yaml", tmp_path) == [tmp_path / "data/b"]
    assert (tmp_path / "data/a/x").read_text() == "kept" and not list((tmp_path / "data/b").iterdir())
    assert not (tmp_path / "data/c.parquet").exists()


def _dvc_project(path, *remote_args):
    path.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=path, check=True)
    subprocess.run([sys.executable, "-m", "dvc", "init", "-q"], cwd=path, check=True)
    if remote_args:
        subprocess.run([sys.executable, "-m", "dvc", "remote", "add", "-d", "lab", *remote_args], cwd=path, check=True)
    return path


@pytest.mark.slow
def test_each_unusable_remote_is_named_with_what_to_configure(tmp_path):
    with pytest.raises(RemoteError, match="no DVC remote is configured(.|\n)*dvc remote add -d lab s3://"):
        check_remote(_dvc_project(tmp_path / "none"), "push")
    missing = _dvc_project(tmp_path / "missing", str(tmp_path / "not-here"))
    with pytest.raises(RemoteError, match="does not exist on this machine: `make push` does not create it"):
        check_remote(missing, "push")
    assert not (tmp_path / "not-here").exists()
    with pytest.raises(RemoteError, match="results pushed there on another machine are not here"):
        check_remote(missing, "pull")
    (tmp_path / "empty-parent").mkdir()
    empty = _dvc_project(tmp_path / "empty", str(tmp_path / "empty-parent"))
    assert check_remote(empty, "push").name == "lab"
    closed = _dvc_project(tmp_path / "closed", "s3://bucket/x")
    subprocess.run(
        [sys.executable, "-m", "dvc", "remote", "modify", "lab", "endpointurl", "http://127.0.0.1:9"],
        cwd=closed,
        check=True,
    )
    with pytest.raises(RemoteError, match=r"DVC remote 'lab' \(s3://bucket/x\) cannot be reached"):
        check_remote(closed, "pull")
