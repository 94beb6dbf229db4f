import json

import polars as pl
import pytest
from conftest import MINI_MMLU

from gna.core.io import sha256_file
from gna.core.settings import Files
from gna.models.sources import ChecksumError
from gna.tasks.tables import (
    KvTask,
    MmluSelection,
    MmluTask,
    build_kv_retrieval,
    build_mmlu,
    context_swapped,
    load_mmlu_jsonl,
    load_task_tables,
    run_kv_task,
    run_mmlu_task,
    select_mmlu,
    select_mmlu_file,
)

MMLU_SELECTION = MmluSelection(n=6, seed=1, topics=("biology",))


def test_kv_is_seeded_and_sizes_are_independent():
    a = build_kv_retrieval([5, 10], 4, seed=1, template="lookup")
    b = build_kv_retrieval([10], 4, seed=1, template="lookup")
    assert a.equals(build_kv_retrieval([5, 10], 4, seed=1, template="lookup"))
    assert a.filter(pl.col("dict_size") == 10)["context"].to_list() == b["context"].to_list()
    assert a["context"].to_list() != build_kv_retrieval([5, 10], 4, seed=2, template="lookup")["context"].to_list()


@pytest.mark.parametrize("template", ["lookup", "study"])
def test_kv_items_are_consistent(template):
    table = build_kv_retrieval([6], 20, seed=3, template=template)
    for row in table.iter_rows(named=True):
        lines = row["context"].split("\n")[1:7]
        pairs = dict(line.split(":") for line in lines)
        assert len(pairs) == 6 and len(set(pairs.values())) == 6
        assert row["choices"][row["target"]].strip() == pairs[row["query_key"]]
        if template == "study":
            assert row["context"].endswith(f"The value of the key '{row['query_key']}' is")
        else:
            assert row["context"].endswith(f"\n{row['query_key']}:")
            example_key = row["context"].split("Lookup:\n")[1].split(":")[0]
            assert example_key != row["query_key"] and example_key in pairs


def test_kv_rejects_bad_template_and_size():
    with pytest.raises(ValueError, match="allowed: lookup, study"):
        build_kv_retrieval([5], 1, 0, "prose")
    with pytest.raises(ValueError, match="out of range"):
        build_kv_retrieval([1], 1, 0, "lookup")


def test_mmlu_loader_skips_header_rows_and_names_bad_file(tmp_path):
    rows = [json.loads(line) for line in MINI_MMLU.read_text().splitlines()]
    bad = dict(rows[0], correct_answer="answer")
    path = tmp_path / "m.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in [bad] + rows) + "\n")
    table = load_mmlu_jsonl(path)
    assert len(table) == len(rows) and table["question_id"].min() == 1
    broken = tmp_path / "broken.jsonl"
    broken.write_text(json.dumps({"question": "q"}) + "\n")
    with pytest.raises(ValueError, match=r"broken.jsonl:1: missing fields"):
        load_mmlu_jsonl(broken)
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        load_mmlu_jsonl(tmp_path / "nope.jsonl")


def test_mmlu_selection_and_formats():
    table = load_mmlu_jsonl(MINI_MMLU)
    subset, pool = select_mmlu(table, 6, seed=1, topics=["biology"])
    assert len(subset) == 6 and set(subset["topic"]) == {"biology"}
    assert not set(subset["question_id"]) & set(pool["question_id"])
    letter = build_mmlu(subset, pool, "letter", num_fewshot=1, seed=1)
    cloze = build_mmlu(subset, pool, "cloze", num_fewshot=0, seed=1)
    assert letter["question_id"].to_list() == cloze["question_id"].to_list()
    first = letter.row(0, named=True)
    assert first["context"].startswith("The following are multiple choice questions (with answers) about biology.\n\n")
    assert first["context"].count("Answer:") == 2 and first["context"].endswith(
        "\nD. " + subset["answer_d"][0] + "\nAnswer:"
    )
    assert first["choices"] == [" A", " B", " C", " D"]
    c0 = cloze.row(0, named=True)
    assert c0["context"] == f"Question: {subset['question'][0]}\nAnswer:"
    assert c0["choices"][c0["target"]] == " " + subset["answer_" + subset["correct_answer"][0].lower()][0]
    with pytest.raises(ValueError, match="unknown topics"):
        select_mmlu(table, 2, 1, ["astrology"])


def test_run_kv_task_writes_the_configured_table(tmp_path):
    settings = KvTask.of({"prompts": {"sizes": [3, 5], "n_per_size": 2, "seed": 4, "template": "study"}})
    table = run_kv_task(Files(), Files(table=str(tmp_path / "kv.parquet")), settings)
    assert table.equals(build_kv_retrieval([3, 5], 2, 4, "study"))
    assert pl.read_parquet(tmp_path / "kv.parquet").equals(table)


def test_task_tables_are_cut_to_max_items_but_a_set_drawn_at_its_own_size(tmp_path):
    build_kv_retrieval([3, 5], 6, 4, "lookup").write_parquet(tmp_path / "kv.parquet")
    subset, pool = select_mmlu(load_mmlu_jsonl(MINI_MMLU), 6, seed=1, topics=["biology"])
    build_mmlu(subset, pool, "letter", num_fewshot=0, seed=1).write_parquet(tmp_path / "mmlu.parquet")
    paths = [str(tmp_path / "kv.parquet"), str(tmp_path / "mmlu.parquet")]
    cut = load_task_tables(paths, 4)
    assert (len(cut["kv_retrieval"]), len(cut["mmlu_letter"])) == (4, 4)
    assert cut["kv_retrieval"]["dict_size"].to_list() == [3, 3, 5, 5]  # evenly over the table
    own = load_task_tables(paths, 4, whole=("kv_retrieval",))
    assert (len(own["kv_retrieval"]), len(own["mmlu_letter"])) == (12, 4)
    assert (len(load_task_tables(paths, 4, whole=("mmlu_letter",))["mmlu_letter"])) == 6


def test_a_repeated_question_stays_out_of_the_pool_when_it_is_evaluated():
    """MMLU repeats some questions under other ids: the pool (few-shot examples, distillation
    text) must not hold the text of any evaluation question."""
    table = load_mmlu_jsonl(MINI_MMLU)
    twin = table.head(len(table)).with_columns(pl.col("question_id") + 10_000)  # every question again
    subset, pool = select_mmlu(pl.concat([table, twin]), 4, 0, [])
    assert len(subset) == 4 and len(pool) == 2 * (table["question"].n_unique() - 4)
    assert not set(pool["question"]) & set(subset["question"])


def test_run_mmlu_task_selects_and_formats_like_the_builders(tmp_path):
    subset, pool = select_mmlu(load_mmlu_jsonl(MINI_MMLU), 6, seed=1, topics=["biology"])
    for fmt in ("letter", "cloze"):
        selection = {"n": 6, "seed": 1, "topics": ["biology"]}
        settings = MmluTask.of({"fmt": fmt, "mmlu": selection, "num_fewshot": 1, "sha256": sha256_file(MINI_MMLU)})
        outputs = Files(table=str(tmp_path / f"{fmt}.parquet"))
        table = run_mmlu_task(Files(mmlu=str(MINI_MMLU)), outputs, settings)
        assert table.equals(build_mmlu(subset, pool, fmt, num_fewshot=1, seed=1))
        assert pl.read_parquet(tmp_path / f"{fmt}.parquet").equals(table)


def test_select_mmlu_file_checks_the_pin():
    unpinned = select_mmlu_file(MINI_MMLU, None, MMLU_SELECTION)
    assert all(
        a.equals(b) for a, b in zip(unpinned, select_mmlu_file(MINI_MMLU, sha256_file(MINI_MMLU), MMLU_SELECTION))
    )
    with pytest.raises(ChecksumError, match="mini_mmlu.jsonl"):
        select_mmlu_file(MINI_MMLU, "0" * 64, MMLU_SELECTION)


def test_context_swapped_gives_each_item_the_next_context_of_its_size():
    table = build_kv_retrieval([4, 6], 3, 5, "lookup")
    swapped = context_swapped(table, None)
    assert swapped.drop("context").equals(table.drop("context"))
    contexts = table["context"].to_list()
    # cyclic within each dictionary size: 0<-1, 1<-2, 2<-0 and 3<-4, 4<-5, 5<-3
    assert swapped["context"].to_list() == [contexts[i] for i in (1, 2, 0, 4, 5, 3)]
    # a subset stays stratified; a size with one item has no partner and is dropped
    assert context_swapped(table, 2)["dict_size"].to_list() == []
    assert len(context_swapped(table, 4)) == 4


def test_sweep_prompts_on_mmlu_are_development_questions_never_evaluated(tmp_path):
    from gna.tasks.tables import SweepPrompts, run_sweep_prompts

    selection = {"n": 6, "seed": 1, "topics": []}
    settings = SweepPrompts.of({"task": "mmlu_letter", "n": 5, "seed": 9, "mmlu": selection})
    out = Files(table=str(tmp_path / "sweep.parquet"))
    dev = run_sweep_prompts(Files(mmlu=str(MINI_MMLU)), out, settings)
    evaluated = run_mmlu_task(
        Files(mmlu=str(MINI_MMLU)),
        Files(table=str(tmp_path / "letter.parquet")),
        MmluTask.of({"fmt": "letter", "mmlu": selection}),
    )
    assert len(dev) == 5 and set(dev["task"]) == {"mmlu_letter"}
    assert not set(dev["question_id"]) & set(evaluated["question_id"])
    assert all(c.endswith("Answer:") for c in dev["context"])
    assert dev["choices"][0].to_list() == [" A", " B", " C", " D"]
    assert dev.equals(pl.read_parquet(tmp_path / "sweep.parquet"))
    assert dev.equals(run_sweep_prompts(Files(mmlu=str(MINI_MMLU)), out, settings))  # seeded
    kv = run_sweep_prompts(Files(), out, SweepPrompts.of({"task": "kv_retrieval", "n": 3, "dict_size": 4}))
    assert kv.equals(build_kv_retrieval([4], 3, seed=4321, template="lookup"))
    with pytest.raises(ValueError, match="heads.sweep_task: unknown task 'mmlu_cloze'"):
        SweepPrompts.of({"task": "mmlu_cloze"})
