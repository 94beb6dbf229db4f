"""gna.students.mixer's family pieces: windows applied and undone by position, the gain of q/k
norms, fused projections split into q, k and v. (The mixer against each family's own attention:
tests/unit/models/test_families.py.)"""

import pytest
import torch
from torch import nn
from transformers.pytorch_utils import Conv1D

from gna.engine.packing import collate, pack
from gna.students.mixer import norm_gain, projections, unwindowed, windowed


def _packed_layout() -> torch.Tensor:
    """[B, T, T] bool layout of two packed items (contexts with choices after them, the shorter
    right-padded), as the engine scores them."""
    items = [pack(list(range(9)), [[1, 2, 3], [4, 5]]), pack(list(range(5)), [[6, 7, 8, 9]])]
    return collate(items).mask[:, 0] == 0


def _windowed_by_positions(layout, positions, window):
    """The engine's own narrowing (PackedBatch.window_mask): keys at positions > p − window."""
    return layout & (positions[:, :, None] - positions[:, None, :] < window)


@pytest.mark.parametrize("window", [2, 3, 5, 100])
def test_unwindowed_recovers_the_layout_beneath_a_window(window):
    causal = torch.ones(1, 12, 12, dtype=torch.bool).tril()
    band = causal & (torch.arange(12)[:, None] - torch.arange(12)[None] < window)
    assert torch.equal(unwindowed(band), causal)
    layout = _packed_layout()
    items = [pack(list(range(9)), [[1, 2, 3], [4, 5]]), pack(list(range(5)), [[6, 7, 8, 9]])]
    narrowed = _windowed_by_positions(layout, collate(items).positions, window)
    assert torch.equal(unwindowed(narrowed), layout)
    # and windowed() narrows it again exactly as the engine does (positions counted from the layout)
    assert torch.equal(windowed(layout, window), narrowed)
    assert torch.equal(unwindowed(layout), layout)  # an unwindowed layout is left as it is


def test_norm_gain_reads_llama_and_gemma_norms():
    from transformers.models.gemma3.modeling_gemma3 import Gemma3RMSNorm
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    w = torch.linspace(-0.5, 2.0, 8)
    llama, gemma = LlamaRMSNorm(8), Gemma3RMSNorm(8)
    with torch.no_grad():
        llama.weight.copy_(w)
        gemma.weight.copy_(w)
    assert torch.equal(norm_gain(llama), w)  # exactly its weight: the default students are unchanged
    assert torch.equal(norm_gain(gemma), w + 1)  # Gemma stores the gain as an offset from 1


class _Fused(nn.Module):
    def __init__(self, kind: str, heads: int, kv: int, p: int, d: int):
        super().__init__()
        if kind == "qkv_proj":  # Phi-3: rows q | k | v
            self.qkv_proj, self.o_proj = nn.Linear(d, (heads + 2 * kv) * p), nn.Linear(heads * p, d)
        elif kind == "query_key_value":  # GPT-NeoX: per head, its q, k and v rows
            self.query_key_value, self.dense = nn.Linear(d, 3 * heads * p), nn.Linear(heads * p, d)
        else:  # GPT-2: Conv1D, stored [in, out]
            self.c_attn, self.c_proj = Conv1D(3 * heads * p, d), Conv1D(d, heads * p)


@pytest.mark.parametrize("kind", ["qkv_proj", "query_key_value", "c_attn"])
def test_fused_projections_split_into_the_teachers_q_k_v(kind):
    heads, p, d = 4, 3, 10
    kv = 2 if kind == "qkv_proj" else heads
    attn = _Fused(kind, heads, kv, p, d)
    q, k, v, o = projections(attn, heads, kv, p)
    x = torch.randn(2, 5, d)
    if kind == "qkv_proj":
        want = attn.qkv_proj(x).split([heads * p, kv * p, kv * p], dim=-1)
    elif kind == "query_key_value":  # as GPTNeoXAttention reads it
        qkv = attn.query_key_value(x).view(2, 5, heads, 3 * p)
        want = [t.reshape(2, 5, heads * p) for t in qkv.chunk(3, dim=-1)]
    else:  # as GPT2Attention reads it
        want = attn.c_attn(x).split(heads * p, dim=-1)
    for got, expected in zip((q(x), k(x), v(x)), want):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    assert o is (attn.o_proj if kind == "qkv_proj" else attn.dense if kind == "query_key_value" else attn.c_proj)
    with pytest.raises(TypeError, match="no q/k/v projections"):
        projections(nn.Module(), heads, kv, p)
