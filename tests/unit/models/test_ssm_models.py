"""Real SSM architectures from transformers (the hub path for Mamba, Mamba-2, FalconMamba and
Zamba2 checkpoints) load through the pipeline's model sources and score like any model."""

import pytest
import torch


def _tiny(family: str, vocab: int):
    import transformers as tf

    if family == "mamba":
        return tf.MambaForCausalLM(tf.MambaConfig(vocab_size=vocab, hidden_size=32, num_hidden_layers=2, state_size=8))
    if family == "falcon_mamba":
        return tf.FalconMambaForCausalLM(tf.FalconMambaConfig(vocab_size=vocab, hidden_size=32, num_hidden_layers=2,
                                                              state_size=8))
    if family == "mamba2":
        return tf.Mamba2ForCausalLM(tf.Mamba2Config(vocab_size=vocab, hidden_size=32, num_hidden_layers=2, num_heads=4,
                                                    head_dim=16, state_size=8, n_groups=1, expand=2))
    if family == "zamba2":
        return tf.Zamba2ForCausalLM(tf.Zamba2Config(
            vocab_size=vocab, hidden_size=32, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4,
            mamba_d_state=8, mamba_headdim=8, n_mamba_heads=8, mamba_expand=2, mamba_ngroups=1,
            layers_block_type=["mamba", "hybrid", "mamba"], intermediate_size=64, attention_head_dim=16,
            use_mem_rope=False, use_mamba_kernels=False))
    raise ValueError(family)


@pytest.mark.parametrize("family", ["mamba", "falcon_mamba", "mamba2", "zamba2"])
def test_ssm_model_prepares_loads_and_scores(tmp_path, family):
    from gna.models.prepare import load_model, prepare_model
    from gna.engine.scoring import score_table, score_table_ref
    from gna.tasks.tables import build_kv_retrieval
    from gna.models.tiny import byte_level_tokenizer

    tok = byte_level_tokenizer()
    torch.manual_seed(0)
    source = tmp_path / "hub-snapshot"
    _tiny(family, len(tok)).save_pretrained(source)
    tok.save_pretrained(source)
    prov = prepare_model(family, {"source": "local", "path": str(source)}, tmp_path / "prepared")
    model, tok2 = load_model(tmp_path / "prepared")
    assert prov["architecture"] == type(model).__name__
    table = build_kv_retrieval([3], 2, seed=0, template="lookup")
    fast = score_table(model, tok2, table, progress=False)
    ref = score_table_ref(model, tok2, table)
    flat = [v for row in fast["logprobs"].to_list() for v in row]
    assert flat == pytest.approx([v for row in ref["logprobs"].to_list() for v in row], abs=1e-4)
    assert all(v < 0 for v in flat)
