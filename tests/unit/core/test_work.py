"""Work counts (gna.core.work): layer-tokens a job ran, independent of the machine."""

import json
import subprocess
import sys

from gna.core import work
from gna.engine.anatomy import decoder_layers
from gna.engine.packing import collate, pack
from gna.engine.scoring import Scorer, encode_table, score_removals, score_table
from gna.tasks.tables import build_kv_retrieval

KV = build_kv_retrieval([3], 4, 0, "lookup")


def test_scoring_counts_every_token_through_every_layer_it_runs(tiny_llama):
    model, tok = tiny_llama
    n_layers = len(decoder_layers(model))
    items = [pack(e.context, e.choices) for e in encode_table(tok, KV)]
    width = max(len(it.ids) for it in items)  # one batch of 4: every item padded to the longest
    score_table(
        Scorer(model, tok, batch_size=4, progress=False), KV
    )  # the engine's one-off check of the model runs first
    work.reset()
    score_table(Scorer(model, tok, batch_size=4, progress=False), KV)
    assert work.layer_tokens() == len(items) * width * n_layers
    assert collate(items).ids.numel() == len(items) * width
    work.reset()
    # removing layer 1: the base pass up to the state entering layer 1 (layer 0 only: nothing reads the
    # base model's own scores), then layers 2.. from it
    score_removals(Scorer(model, tok, batch_size=4, progress=False), KV, list(range(n_layers)), [1])
    assert work.layer_tokens() == len(items) * width * (1 + n_layers - 2)


def test_a_job_writes_its_count_beside_its_log(tmp_path):
    script = (
        "from gna.core import work\nfrom gna.core.runtime import setup\n"
        f"setup({str(tmp_path / 'step.log')!r})\nwork.add(1000, 3)\n"
    )
    subprocess.run([sys.executable, "-c", script], check=True, cwd=tmp_path)
    assert json.loads((tmp_path / "step.work.json").read_text()) == {"layer_tokens": 3000, "flops": 0.0}


def test_scoring_counts_its_useful_flops_from_the_models_shapes(tiny_llama):
    """2 per weight of the layers' linear maps at every position, causal attention (2 · T² · query
    width per sequence), and the output head at the read-out rows: computed here from the config."""
    model, tok = tiny_llama
    c = model.config
    d, head_dim = c.hidden_size, c.hidden_size // c.num_attention_heads
    per_token = 2 * (
        d * c.num_attention_heads * head_dim * 2  # q and o
        + 2 * d * c.num_key_value_heads * head_dim  # k and v
        + 3 * d * c.intermediate_size  # gate, up, down
    )
    items = [pack(e.context, e.choices) for e in encode_table(tok, KV)]
    width = max(len(it.ids) for it in items)
    rows = sum(len({p for positions in it.score_at for p in positions}) for it in items)
    layers = c.num_hidden_layers
    attention = 2 * len(items) * width**2 * c.num_attention_heads * head_dim
    head = 2 * rows * d * c.vocab_size
    # the last layer's MLP and output projection run at the read rows only (Scorer.read_rows_only)
    skipped = (len(items) * width - rows) * 2 * (d * c.num_attention_heads * head_dim + 3 * d * c.intermediate_size)
    for read_rows_only, not_run in ((False, 0), (True, skipped)):
        scorer = Scorer(model, tok, batch_size=4, progress=False, read_rows_only=read_rows_only)
        score_table(scorer, KV)
        work.reset()
        score_table(scorer, KV)
        expected = len(items) * width * per_token * layers + attention * layers + head - not_run
        assert work.useful_flops() == expected, read_rows_only
