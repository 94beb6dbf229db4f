"""Tiny random models with a byte-level tokenizer, for tests and the smoke workflow.

No training and no download: the tokenizer maps each byte to one token, so any text encodes,
and digits of KV values become separate tokens (exercising multi-token scoring paths).
"""

from __future__ import annotations

from pathlib import Path

import torch


def byte_level_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    vocab = {ch: i for i, ch in enumerate(bytes_to_unicode().values())}
    vocab["<|endoftext|>"] = len(vocab)
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        bos_token="<|endoftext|>",
        eos_token="<|endoftext|>",
        unk_token="<|endoftext|>",
        pad_token="<|endoftext|>",
    )


DEFAULT_WINDOW = 8


def _config(arch: str, spec: dict, vocab: int, special: dict):
    """A tiny transformers config of family `arch`, shaped by the spec's layers/hidden/heads/
    kv_heads; windowed families get a small `window` (default 8) so that test prompts reach
    past it (None: no sliding window where the family allows it)."""
    import transformers as tf

    d, n_layers = spec.get("hidden", 64), spec.get("layers", 4)
    heads, kv = spec.get("heads", 4), spec.get("kv_heads", 2)
    window = spec.get("window", DEFAULT_WINDOW)
    attn = dict(
        vocab_size=vocab,
        hidden_size=d,
        intermediate_size=spec.get("intermediate", 2 * d),
        num_hidden_layers=n_layers,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        **special,
    )
    alternating = ["sliding_attention" if i % 2 == 0 and window else "full_attention" for i in range(n_layers)]
    ssm = dict(vocab_size=vocab, hidden_size=d, num_hidden_layers=n_layers, **special)
    builders = {
        "llama": lambda: tf.LlamaConfig(**attn),
        "mistral": lambda: tf.MistralConfig(**attn, sliding_window=window),
        "qwen2": lambda: tf.Qwen2Config(
            **attn, use_sliding_window=window is not None, sliding_window=window, max_window_layers=n_layers // 2
        ),
        "qwen3": lambda: tf.Qwen3Config(**attn, head_dim=d // heads),
        "gemma2": lambda: tf.Gemma2Config(
            **attn,
            head_dim=d // heads,
            sliding_window=window,
            query_pre_attn_scalar=d // heads,
            layer_types=alternating,
        ),
        "gemma3": lambda: tf.Gemma3TextConfig(
            **attn,
            head_dim=d // heads,
            sliding_window=window,
            query_pre_attn_scalar=d // heads,
            layer_types=alternating,
        ),
        "phi3": lambda: tf.Phi3Config(**attn, pad_token_id=special["eos_token_id"]),
        "olmo2": lambda: tf.Olmo2Config(**attn, pad_token_id=special["eos_token_id"]),
        "gpt_neox": lambda: tf.GPTNeoXConfig(
            vocab_size=vocab,
            hidden_size=d,
            intermediate_size=2 * d,
            num_hidden_layers=n_layers,
            num_attention_heads=heads,
            rotary_pct=0.25,
            max_position_embeddings=4096,
            tie_word_embeddings=False,
            **special,
        ),
        "gpt2": lambda: tf.GPT2Config(
            vocab_size=vocab, n_embd=d, n_layer=n_layers, n_head=heads, n_positions=4096, **special
        ),
        "mamba": lambda: tf.MambaConfig(**ssm, state_size=8, intermediate_size=2 * d),
        "falcon_mamba": lambda: tf.FalconMambaConfig(**ssm, state_size=8, intermediate_size=2 * d),
        "mamba2": lambda: tf.Mamba2Config(
            **ssm, state_size=8, num_heads=2 * d // 16, head_dim=16, n_groups=1, expand=2, chunk_size=16
        ),
        "zamba2": lambda: tf.Zamba2Config(
            **ssm,
            num_attention_heads=heads,
            num_key_value_heads=heads,
            mamba_d_state=8,
            mamba_headdim=16,
            n_mamba_heads=2 * d // 16,
            mamba_expand=2,
            mamba_ngroups=1,
            num_mem_blocks=1,
            adapter_rank=8,
            layers_block_type=["mamba" if i % 2 == 0 else "hybrid" for i in range(n_layers)],
            intermediate_size=2 * d,
            max_position_embeddings=4096,
            use_mamba_kernels=False,
        ),
    }
    if arch not in builders:
        raise ValueError(f"unknown tiny-random arch {arch!r}; allowed: {', '.join(builders)}")
    return builders[arch]()


ARCHS = (
    "llama",
    "mistral",
    "qwen2",
    "qwen3",
    "gemma2",
    "gemma3",
    "phi3",
    "olmo2",
    "gpt_neox",
    "gpt2",
    "mamba",
    "falcon_mamba",
    "mamba2",
    "zamba2",
)


def tiny_random_model(spec: dict):
    """(model, tokenizer) for a tiny random config of family `spec['arch']` (ARCHS); weights
    depend only on `spec['seed']`."""
    from transformers import MODEL_FOR_CAUSAL_LM_MAPPING

    from gna.engine.anatomy import engine_ready

    arch = spec.get("arch", "llama")
    if arch not in ARCHS:
        raise ValueError(f"unknown tiny-random arch {arch!r}; allowed: {', '.join(ARCHS)}")
    tok = byte_level_tokenizer()
    special = {"bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id}
    # a larger vocabulary than the tokenizer's (`vocab`) gives a model the output head of a real one
    config = _config(arch, spec, spec.get("vocab") or len(tok), special)
    torch.manual_seed(int(spec.get("seed", 0)))
    model = engine_ready(MODEL_FOR_CAUSAL_LM_MAPPING[type(config)](config))
    model.eval()
    return model, tok


def shaped_random_model(model_dir: str | Path, layers: int, seed: int = 0):
    """A random model with the shapes of the prepared model at `model_dir` (its config.json) and its
    first `layers` decoder layers: a model's speed per layer without its weights (benchmarks). Its
    per-layer settings (layer_types) are cut to `layers` as well."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from gna.engine.anatomy import engine_ready

    config = AutoConfig.from_pretrained(model_dir)
    for key in ("layer_types", "layers_block_type"):
        if isinstance(getattr(config, key, None), list):
            setattr(config, key, getattr(config, key)[:layers])
    config.num_hidden_layers = layers
    torch.manual_seed(seed)
    return engine_ready(AutoModelForCausalLM.from_config(config)).eval()
