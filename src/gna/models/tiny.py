"""Tiny random models with a byte-level tokenizer, for tests and the smoke workflow.

No training and no download: the tokenizer maps each byte to one token, so any text encodes,
and digits of KV values become separate tokens (exercising multi-token scoring paths).
"""

from __future__ import annotations

import torch

ARCHS = ("llama",)


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
        tokenizer_object=core, bos_token="<|endoftext|>", eos_token="<|endoftext|>",
        unk_token="<|endoftext|>", pad_token="<|endoftext|>",
    )


def tiny_random_model(spec: dict):
    """(model, tokenizer) for a tiny random config; weights depend only on `spec['seed']`."""
    arch = spec.get("arch", "llama")
    tok = byte_level_tokenizer()
    if arch != "llama":
        raise ValueError(f"unknown tiny-random arch {arch!r}; allowed: {', '.join(ARCHS)}")
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=spec.get("hidden", 64),
        intermediate_size=spec.get("intermediate", 2 * spec.get("hidden", 64)),
        num_hidden_layers=spec.get("layers", 4),
        num_attention_heads=spec.get("heads", 4),
        num_key_value_heads=spec.get("kv_heads", 2),
        max_position_embeddings=4096,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        tie_word_embeddings=False,
    )
    torch.manual_seed(int(spec.get("seed", 0)))
    model = LlamaForCausalLM(config)
    model.eval()
    return model, tok
