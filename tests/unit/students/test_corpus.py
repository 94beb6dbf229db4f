"""The distillation corpus (gna.students.corpus): token windows, answer marks, KV prompts kept
apart from the evaluation items."""

import json
from pathlib import Path

import polars as pl
import pytest
import torch
import yaml
from conftest import MINI_MMLU

from gna.core.io import write_parquet
from gna.core.settings import Files
from gna.students.corpus import (
    Corpus,
    DistillCorpusCheck,
    answer_tokens,
    answered_kv,
    check_no_evaluation_items,
    corpus_kv_seed,
    run_distill_corpus_check,
    split_pool,
    token_windows,
)
from gna.tasks.tables import (
    KD_VALIDATION,
    PROMPT_SETS_DIR,
    KvPrompts,
    build_kv_retrieval,
    check_validation_apart,
    kv_prompt_sets,
    write_kv_task,
)
from gna.workflow.config import load_schema, validate_config

REPO = Path(__file__).resolve().parents[3]


def test_split_pool_holds_out_the_first_share():
    pool = pl.DataFrame({"q": list(range(10))})
    train, held = split_pool(pool, 0.2)
    assert held["q"].to_list() == [0, 1] and train["q"].to_list() == list(range(2, 10))


def test_token_windows_are_seeded_and_refuse_a_small_corpus(tiny_llama):
    _, tok = tiny_llama
    docs, kv = [(f"question {i} answer:", " B") for i in range(20)], [(f"k{i}:v{i}\nk{i}:", f"v{i}") for i in range(20)]
    a, answers = token_windows(tok, docs, kv, Corpus(seq_len=16, kv_share=0.5), 5, seed=1)
    assert a.shape == answers.shape == (5, 16) and answers.dtype == torch.bool
    again = token_windows(tok, docs, kv, Corpus(seq_len=16, kv_share=0.5), 5, seed=1)
    assert torch.equal(a, again[0]) and torch.equal(answers, again[1])
    assert not torch.equal(a, token_windows(tok, docs, kv, Corpus(seq_len=16, kv_share=0.5), 5, seed=2)[0])
    with pytest.raises(ValueError, match="corpus too small"):
        token_windows(tok, docs[:1], [], Corpus(seq_len=16, kv_share=0.5), 5, seed=1)


def test_answer_mask_marks_the_positions_that_predict_an_answer_token(tiny_llama):
    _, tok = tiny_llama
    context, answer = "question one answer:", " B"
    ids, is_answer = answer_tokens(tok, context, answer)
    assert ids == tok(context + answer, add_special_tokens=False)["input_ids"]
    n_answer = sum(is_answer)
    assert n_answer >= 1 and is_answer[-n_answer:] == [True] * n_answer and not any(is_answer[:-n_answer])
    windows, predicts = token_windows(tok, [(context, answer)] * 40, [], Corpus(seq_len=8, kv_share=0.0), 4, seed=0)
    stream, marks = windows.flatten().tolist(), predicts.flatten().tolist()
    doc = len(ids) + 1  # the document and its EOS separator
    for t in range(len(stream) - 1):
        assert marks[t] == (
            t % doc in range(len(ids) - 1 - n_answer, len(ids) - 1)
        )  # the next token is an answer token


class OpensWithBos:
    """A tokenizer that puts BOS before a text, as Gemma's does: the tiny one's, BOS its own id."""

    def __init__(self, tok):
        self.tok, self.bos_token_id, self.eos_token_id = tok, 300, tok.eos_token_id

    def __call__(self, text, add_special_tokens=True):
        ids = self.tok(text, add_special_tokens=False)["input_ids"]
        return {"input_ids": ([self.bos_token_id] if add_special_tokens else []) + ids}


def test_windows_open_with_bos_where_the_tokenizer_puts_one(tiny_llama):
    """Each window is BOS and then the stream the same corpus cuts into windows one token shorter,
    answer marks shifted with it: BOS predicts the window's first token, as in a scored prompt."""
    _, tok = tiny_llama
    docs, kv = [(f"question {i} answer:", " B") for i in range(20)], [(f"k{i}:v{i}\nk{i}:", f"v{i}") for i in range(20)]
    windows, predicts = token_windows(OpensWithBos(tok), docs, kv, Corpus(seq_len=16, kv_share=0.5), 5, seed=1)
    plain, plain_predicts = token_windows(tok, docs, kv, Corpus(seq_len=15, kv_share=0.5), 5, seed=1)
    assert windows.shape == predicts.shape == (5, 16)
    assert windows[:, 0].tolist() == [300] * 5 and torch.equal(windows[:, 1:], plain)
    assert torch.equal(predicts[:, 1:], plain_predicts) and plain_predicts.any()
    assert torch.equal(predicts[1:, 0], plain_predicts[:-1, -1])  # BOS: is the window's first token an answer's?


def test_corpus_kv_prompts_never_come_from_an_evaluation_seed():
    evaluation = set(build_kv_retrieval([3, 5], 20, seed=7, template="lookup")["context"])
    corpus = {c for c, _ in answered_kv([3, 5], 40, corpus_kv_seed("train", 7), "lookup")}
    assert corpus and not corpus & evaluation
    assert corpus_kv_seed("train", 7) != corpus_kv_seed("heldout", 7)


def test_a_corpus_holding_an_evaluation_item_is_refused(tmp_path):
    """The corpus check: a KV prompt of the corpus among the evaluation items (here made so on
    purpose) stops it, naming the split; disjoint items pass and are counted."""
    config = {
        "heldout_share": 0.5,
        "train_windows": 2,
        "heldout_windows": 1,
        "seq_len": 16,
        "kv_share": 1.0,
        "kv_sizes": [3],
    }
    mmlu = {"n": 4, "seed": 0, "topics": []}
    clean = build_kv_retrieval([3], 4, seed=0, template="lookup")
    write_parquet(clean, tmp_path / "kv.parquet")
    write_parquet(build_kv_retrieval([3], 4, seed=9, template="lookup"), tmp_path / "validation.parquet")

    settings = DistillCorpusCheck.of({"corpus": config, "seed": 0, "mmlu": mmlu, "template": "lookup"})

    def check(out: str) -> dict:
        inputs = Files(
            mmlu=str(MINI_MMLU),
            kv=str(tmp_path / "kv.parquet"),
            validation=str(tmp_path / "validation.parquet"),
        )
        return run_distill_corpus_check(inputs, Files(check=str(tmp_path / out)), settings)

    counts = check("check.json")
    assert counts["evaluation_kv_prompts"] == 4 and counts["train_kv_prompts"] > 0
    assert counts["validation_kv_prompts"] == 4
    assert json.loads((tmp_path / "check.json").read_text())["leaked"] == 0
    # the prompts of checkpoint selection: one of them an evaluation prompt, then a corpus document
    write_parquet(
        build_kv_retrieval([3], 4, seed=9, template="lookup").with_columns(pl.Series("context", clean["context"])),
        tmp_path / "validation.parquet",
    )
    with pytest.raises(ValueError, match="4 KV prompts of checkpoint selection are evaluation items"):
        check("check1.json")
    corpus_prompt = answered_kv([3], 2, corpus_kv_seed("train", 0), "lookup")[0][0]
    write_parquet(
        build_kv_retrieval([3], 1, seed=9, template="lookup").with_columns(pl.lit(corpus_prompt).alias("context")),
        tmp_path / "validation.parquet",
    )
    with pytest.raises(ValueError, match=r"train KV-retrieval prompts \(validation\)"):
        check("check1.json")
    write_parquet(build_kv_retrieval([3], 4, seed=9, template="lookup"), tmp_path / "validation.parquet")
    write_parquet(clean.with_columns(pl.lit(corpus_prompt).alias("context")), tmp_path / "kv.parquet")
    with pytest.raises(ValueError, match="train KV-retrieval prompts are evaluation items"):
        check("check2.json")
    with pytest.raises(ValueError, match="1 MMLU questions are evaluation items"):
        check_no_evaluation_items(["q1", "q2"], ["q2", "q3"], "MMLU questions")


@pytest.mark.parametrize("config_file", ["config.yaml", "paper.yaml", "gemma3-270m.yaml"])
def test_validation_prompts_share_none_of_the_workflows_prompt_sets(tmp_path, config_file):
    """Every KV prompt set a shipped config builds (kv_prompt_sets, written as the kv_task rule
    writes it): the checkpoint-selection prompts share no prompt with the sweep, the curves, the
    roles, the maps, the masking or the evaluation, and the corpus check passes on the files.
    The validation prompts are set, explicitly, at the sweep's seed and dictionary size: the case
    where only the seed namespace keeps them apart (integer seeds would draw the sweep's prompts)."""
    config = validate_config(
        yaml.safe_load((REPO / "config" / config_file).read_text()), load_schema(REPO / "config/schema.yaml")
    )
    config["hybrid"]["validation"]["seed"] = config["heads"]["seed"]
    config["hybrid"]["dict_size"] = config["heads"]["sweep_dict_size"]
    sets = kv_prompt_sets(config)
    same_seed = {**sets[f"{PROMPT_SETS_DIR}/{KD_VALIDATION}"], "seed": config["heads"]["seed"]}
    assert same_seed["sizes"] == sets[f"{PROMPT_SETS_DIR}/head_sweep"]["sizes"]
    paths = {}
    for name, keys in sets.items():
        paths[name] = tmp_path / f"{name.replace('/', '-')}.parquet"
        write_kv_task(
            KvPrompts(
                **{k: tuple(v) if k == "sizes" else v for k, v in keys.items() if k in KvPrompts.__dataclass_fields__}
            ),
            paths[name],
        )
    validation = paths.pop(f"{PROMPT_SETS_DIR}/{KD_VALIDATION}")
    hybrid = config["hybrid"]
    settings = DistillCorpusCheck.of(
        {
            "corpus": hybrid["corpus"],
            "seed": hybrid["seed"],
            "mmlu": {"n": 4, "seed": 0, "topics": []},
            "template": config["tasks"]["kv_retrieval"]["template"],
        }
    )
    inputs = Files(mmlu=str(MINI_MMLU), kv=str(paths.pop("kv_retrieval")), validation=str(validation))
    run_distill_corpus_check(inputs, Files(check=str(tmp_path / "check.json")), settings)
    validation_kv = pl.read_parquet(validation)["context"]
    assert len(paths) >= 5
    # without the namespace, the same seed would draw the sweep's own prompts
    write_kv_task(KvPrompts(**{**same_seed, "sizes": tuple(same_seed["sizes"])}), tmp_path / "integer-seed.parquet")
    with pytest.raises(ValueError, match="also prompts of"):
        check_validation_apart(
            pl.read_parquet(tmp_path / "integer-seed.parquet")["context"],
            pl.read_parquet(paths[f"{PROMPT_SETS_DIR}/head_sweep"])["context"],
            "head_sweep",
        )
    for path in paths.values():
        assert check_validation_apart(validation_kv, pl.read_parquet(path)["context"], str(path)) > 0
    # the check itself: the sweep's prompts as the validation set are refused, naming the set
    sweep = pl.read_parquet(paths[f"{PROMPT_SETS_DIR}/head_sweep"])["context"]
    with pytest.raises(
        ValueError, match=r"hybrid.validation: \d+ KV prompts of checkpoint selection are also prompts of .*head_sweep"
    ):
        check_validation_apart(sweep, sweep, str(paths[f"{PROMPT_SETS_DIR}/head_sweep"]))
