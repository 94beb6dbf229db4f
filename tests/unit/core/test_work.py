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
    # removing layer 1: the base pass, then layers 2.. again from the state entering 1's successors
    score_removals(Scorer(model, tok, batch_size=4, progress=False), KV, list(range(n_layers)), [1])
    assert work.layer_tokens() == len(items) * width * (n_layers + n_layers - 2)


def test_a_job_writes_its_count_beside_its_log(tmp_path):
    script = (
        "from gna.core import work\nfrom gna.core.runtime import setup\n"
        f"setup({str(tmp_path / 'step.log')!r})\nwork.add(1000, 3)\n"
    )
    subprocess.run([sys.executable, "-c", script], check=True, cwd=tmp_path)
    assert json.loads((tmp_path / "step.work.json").read_text()) == {"layer_tokens": 3000}
