"""Soft-capped attention (Gemma 2's attn_logit_softcapping) runs eager in every loader.

transformers <= 5.18 put Gemma 2 on sdpa, which drops `softcap` without a word (5.23 refuses sdpa
for it): a teacher loaded there ran uncapped while its students capped. The tests put 5.17's
behaviour back (sdpa allowed, softcap dropped) and show that the loaders still give eager, that a
student keeping every head then equals its teacher, and that the engine refuses the sdpa model."""

import copy

import numpy as np
import pytest
import torch

from gna.engine.anatomy import UnsupportedModel, soft_capped
from gna.engine.scoring import Scorer, score_table
from gna.models.prepare import load_model, prepare_model
from gna.models.tiny import tiny_random_model
from gna.tasks.tables import build_kv_retrieval

KV = build_kv_retrieval([3, 4], 2, seed=0, template="lookup")
GEMMA2 = {"arch": "gemma2", "layers": 4, "hidden": 32, "heads": 4, "kv_heads": 2, "seed": 1}


@pytest.fixture
def older_transformers(monkeypatch):
    """transformers 5.17's Gemma 2: sdpa allowed (and chosen by default), `softcap` dropped there."""
    from transformers.integrations import sdpa_attention
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
    from transformers.models.gemma2 import modeling_gemma2

    sdpa = sdpa_attention.sdpa_attention_forward

    def dropping_softcap(*args, softcap=None, **kwargs):
        return sdpa(*args, **kwargs)

    monkeypatch.setattr(modeling_gemma2.Gemma2PreTrainedModel, "_supports_sdpa", True)
    monkeypatch.setitem(ALL_ATTENTION_FUNCTIONS, "sdpa", dropping_softcap)


@pytest.fixture
def gemma2_folder(tmp_path):
    model, tok = tiny_random_model(GEMMA2)
    # attention logits that reach the cap (at random init Gemma 2's 50 caps nothing)
    model.config.attn_logit_softcapping = 1.0
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("q_proj.weight", "k_proj.weight")):
                p.mul_(20.0)
    model.save_pretrained(tmp_path / "hf")
    tok.save_pretrained(tmp_path / "hf")
    prepare_model("gemma2", {"source": "local", "path": str(tmp_path / "hf")}, tmp_path / "prepared")
    return tmp_path / "prepared"


def _flat(frame) -> np.ndarray:
    return np.concatenate(frame["logprobs"].to_list())


def test_soft_capped_models_load_eager_under_older_transformers(older_transformers, gemma2_folder):
    from transformers import AutoModelForCausalLM

    from gna.students.spec import load_any, make_hybrid, save_student

    plain = AutoModelForCausalLM.from_pretrained(gemma2_folder).eval()
    assert soft_capped(plain.config) and plain.config._attn_implementation == "sdpa"  # the patch holds
    model, tok = load_model(gemma2_folder)
    assert model.config._attn_implementation == "eager"
    assert tiny_random_model(GEMMA2)[0].config._attn_implementation == "eager"
    ids = torch.tensor([tok(KV["context"][0]).input_ids])
    with torch.no_grad():  # the loader puts `model` on the suite's device; `plain` stays on the CPU
        dropped = (plain(ids).logits - model(ids.to(model.device)).logits.cpu()).abs().max().item()
    # what the patch costs where a loader keeps sdpa (measured: 0.56 here; 3.6e-3 on 5.17 at Gemma 2's cap)
    assert dropped > 1e-4
    teacher = _flat(score_table(Scorer(model, tok, progress=False), KV))
    every_head = [
        [i, h] for i in range(model.config.num_hidden_layers) for h in range(model.config.num_attention_heads)
    ]
    kept_all = make_hybrid(copy.deepcopy(model), [tuple(x) for x in every_head], 4)
    assert np.abs(_flat(score_table(Scorer(kept_all, tok, progress=False), KV)) - teacher).max() <= 1e-4
    save_student(kept_all, tok, gemma2_folder.parent / "student", {"state_size": 4, "kept_heads": every_head})
    reloaded, _ = load_any(gemma2_folder.parent / "student")
    assert reloaded.config._attn_implementation == "eager"
    assert np.abs(_flat(score_table(Scorer(reloaded, tok, progress=False), KV)) - teacher).max() <= 1e-4


def test_the_engine_refuses_a_soft_capped_model_on_another_attention_path(older_transformers, gemma2_folder):
    from transformers import AutoModelForCausalLM

    plain = AutoModelForCausalLM.from_pretrained(gemma2_folder).eval()
    _, tok = load_model(gemma2_folder)
    with pytest.raises(UnsupportedModel, match=r"gemma2 .*attn_logit_softcapping.* runs 'sdpa' attention"):
        score_table(Scorer(plain, tok, progress=False), KV)
    plain.set_attn_implementation("eager")
    score_table(Scorer(plain, tok, progress=False), KV)  # eager: accepted
