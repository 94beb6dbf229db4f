"""Recurrent inference with students and its memory: whole-model prefill and decoding steps
(a K/V cache for the attention heads' groups; per SSM head an N×P state, the first token's
P-vector value and the last few tokens' values for the local skip), the memory formula
per variant, a measured check of it, and the hybrid phase's memory table."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import polars as pl
import torch

from gna.core.io import write_parquet
from gna.core.settings import Files, RuleSettings
from gna.engine.anatomy import final_norm, sliding_windows
from gna.engine.device import device_of
from gna.students.mixer import LOCAL_WIDTH, layer_forward, layers_of, mixer_of, rotary
from gna.students.spec import load_student, read_spec

log = logging.getLogger("gna.students.decoding")


# -- recurrent inference over the whole model ------------------------------------------------


def _embedded(model, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """The hidden state entering the first layer: the token embedding (Gemma's scales itself),
    plus the learned position embedding where the family has one (GPT-2's wpe)."""
    h = model.get_input_embeddings()(ids)
    wpe = getattr(model.base_model, "wpe", None)
    return h if wpe is None else h + wpe(positions)


def _logits(model, h: torch.Tensor) -> torch.Tensor:
    """The output head on the final norm of h, soft-capped where the family caps its logits."""
    logits = model.get_output_embeddings()(final_norm(model)(h))
    cap = getattr(model.config, "final_logit_softcapping", None)
    return logits if cap is None else torch.tanh(logits / cap) * cap


def _rotary_per_layer(base, h: torch.Tensor, positions: torch.Tensor) -> list:
    """Each layer's rotary tables at `positions` (computed once per layer type)."""
    n_layers = len(layers_of(base))
    types = getattr(base.config, "layer_types", None) or ["all"] * n_layers
    tables = {}
    for i, kind in enumerate(types[:n_layers]):
        if kind not in tables:
            tables[kind] = rotary(base, h, positions, i)
    return [tables[kind] for kind in types[:n_layers]]


@torch.inference_mode()
def prefill(model, ids: torch.Tensor):
    """Run a hybrid on ids [B, L] keeping what generation needs; returns (last logits, caches)."""
    base = model.base_model
    pos = torch.arange(ids.shape[1], device=ids.device)[None].expand(ids.shape[0], -1)
    h = _embedded(model, ids, pos)
    caches = []

    def attend(layer, rope):
        def run(u):
            out, cache = mixer_of(layer).prefill(u, rope)
            caches.append(cache)
            return out

        return run

    for layer, rope in zip(layers_of(model), _rotary_per_layer(base, h, pos)):
        h = layer_forward(layer, h, attend(layer, rope))
    return _logits(model, h[:, -1:]), caches


@torch.inference_mode()
def step(model, token: torch.Tensor, position: int, caches: list[dict]):
    """One decoding step for token [B, 1] at `position`; returns its logits [B, 1, V]."""
    positions = torch.full_like(token, position)
    h = _embedded(model, token, positions)
    ropes = _rotary_per_layer(model.base_model, h, positions)
    for layer, cache, rope in zip(layers_of(model), caches, ropes):
        h = layer_forward(layer, h, lambda u, layer=layer, cache=cache, rope=rope: mixer_of(layer).step(u, rope, cache))
    return _logits(model, h)


def cache_nbytes(caches: list[dict]) -> int:
    """Bytes held by the K/V tensors and SSM states of `prefill`'s caches."""
    return sum(
        t.numel() * t.element_size()
        for c in caches
        for key, t in c.items()
        if key in ("k", "v", "state", "first", "recent")
    )


# -- inference memory from the configuration --------------------------------------------------


def inference_memory(
    shape, kept: list[tuple[int, int]] | None, state_size: int, seq_len: int, bytes_per_value: int = 2, batch: int = 1
) -> dict:
    """Bytes of KV cache and SSM state for one sequence of `seq_len` tokens.

    shape: the model's config (layers, heads, K/V heads, head size, sliding windows). kept=None
    is the teacher (every head attention). A K/V group is cached when any of its query heads is
    attention, for the whole sequence or, in a sliding-window layer, for the window's last
    tokens; each SSM head holds an N×P state plus the first token's value (P) and the last
    LOCAL_WIDTH values (the local skip's, LOCAL_WIDTH×P), whatever the length."""
    n_layers, n_heads = shape.num_hidden_layers, shape.num_attention_heads
    group = n_heads // shape.num_key_value_heads
    head_dim = getattr(shape, "head_dim", None) or shape.hidden_size // n_heads
    if kept is None:
        kept = [(i, h) for i in range(n_layers) for h in range(n_heads)]
    keep = {(int(a), int(b)) for a, b in kept}
    cached = [seq_len if w is None else min(seq_len, w) for w in sliding_windows(shape, n_layers)]
    kv = sum(2 * head_dim * cached[i] * bytes_per_value * batch for i, _ in {(i, h // group) for i, h in keep})
    n_ssm = n_layers * n_heads - len(keep)
    state = n_ssm * (state_size + 1 + LOCAL_WIDTH) * head_dim * bytes_per_value * batch
    return {"kv_cache_bytes": kv, "ssm_state_bytes": state, "total_bytes": kv + state}


def memory_rows(
    name: str, cfg, kept: list | None, state_size: int, seq_lens: list[int], bytes_per_value: int
) -> list[dict]:
    """inference_memory of one variant (kept=None: the teacher) at each length, as table rows."""
    rows = []
    for length in seq_lens:
        mem = inference_memory(cfg, kept, state_size, length, bytes_per_value)
        rows.append(
            {
                "variant": name,
                "heads_kept": None if kept is None else len(kept),
                "state_size": None if kept is None else state_size,
                "seq_len": length,
                **mem,
            }
        )
    return rows


def measured_cache(model, length: int, seed: int = 0) -> int:
    """Bytes actually held by a student's recurrent cache after a prefill of `length` tokens."""
    # drawn on the CPU whatever the model's device, so a seed gives the same tokens everywhere
    gen = torch.Generator(device="cpu").manual_seed(seed)
    ids = torch.randint(0, model.config.vocab_size, (1, length), generator=gen, device="cpu").to(device_of(model))
    _, caches = prefill(model, ids)
    return cache_nbytes(caches)


# -- the memory table -------------------------------------------------------------------------


def formula_table(cfg, specs: list[dict], seq_lens: list[int], bytes_per_value: int) -> pl.DataFrame:
    """The formula's rows (source 'formula'): the teacher, then each student spec in order."""
    rows = memory_rows("teacher", cfg, None, 0, seq_lens, bytes_per_value)
    for spec in specs:
        rows += memory_rows(spec["variant"], cfg, spec["kept_heads"], spec["state_size"], seq_lens, bytes_per_value)
    return pl.DataFrame(rows).with_columns(pl.lit("formula").alias("source"))


def largest_cache(specs: dict[str, dict]) -> str:
    """The student (key of `specs`) with the most attention heads, then the largest state: the
    one whose measured cache checks the formula best (most of it is KV cache)."""
    return max(specs, key=lambda f: (len(specs[f]["kept_heads"]), specs[f]["state_size"]))


def measured_check(cfg, spec: dict, measured: int, length: int, bytes_per_value: int) -> pl.DataFrame:
    """One row (source 'measured'): the measured cache bytes of student `spec` at `length`
    tokens as total_bytes, beside the formula's bytes (formula_bytes)."""
    expected = memory_rows(spec["variant"], cfg, spec["kept_heads"], spec["state_size"], [length], bytes_per_value)[0]
    return pl.DataFrame(
        [
            {
                **expected,
                "source": "measured",
                "total_bytes": measured,
                "kv_cache_bytes": None,
                "ssm_state_bytes": None,
                "formula_bytes": expected["total_bytes"],
            }
        ]
    )


@dataclass(frozen=True)
class Memory:
    """The inference-memory table (config block hybrid.memory): the formula at each length of
    `seq_lens` with `bytes_per_value` bytes per cached value, and the measured check at
    `check_len` tokens."""

    seq_lens: tuple[int, ...] = (128, 2048, 4096)
    bytes_per_value: int = 2
    check_len: int = 2048


@dataclass(frozen=True)
class HybridMemory(RuleSettings):
    """Rule hybrid_memory's settings: the teacher `model` (wildcard model) and `memory`
    (hybrid.memory)."""

    model: str
    memory: Memory = Memory()


def run_hybrid_memory(inputs: Files, outputs: Files, settings: HybridMemory) -> pl.DataFrame:
    """The memory table of the teacher inputs.model and its students inputs.students (folders):
    formula_table at memory.seq_lens with memory.bytes_per_value (memory = settings.memory), then
    measured_check of the largest_cache student at memory.check_len tokens (fp32 as loaded);
    written to outputs.memory with a model column."""
    from transformers import AutoConfig

    model_name, memory = settings.model, settings.memory
    model_dir, student_dirs = inputs.model, list(inputs.students)

    cfg = AutoConfig.from_pretrained(model_dir)
    specs = {folder: read_spec(folder) for folder in student_dirs}
    frame = formula_table(cfg, list(specs.values()), list(memory.seq_lens), memory.bytes_per_value)
    folder = largest_cache(specs)
    student, _ = load_student(folder)
    measured = measured_cache(student, memory.check_len)
    check = measured_check(
        cfg, specs[folder], measured, memory.check_len, torch.finfo(next(student.parameters()).dtype).bits // 8
    )
    log.info(
        "measured cache of %s at %d tokens: %d bytes (formula %d)",
        specs[folder]["variant"],
        memory.check_len,
        measured,
        check["formula_bytes"][0],
    )
    frame = pl.concat([frame, check], how="diagonal_relaxed").with_columns(pl.lit(model_name).alias("model"))
    write_parquet(frame, outputs.memory)
    return frame
