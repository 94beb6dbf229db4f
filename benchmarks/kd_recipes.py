"""KD recipes compared on the validation prompts of checkpoint selection, never on evaluation items.

    python benchmarks/kd_recipes.py --data DATA --model gemma3-270m --variants k10-n16 \
        --recipes today,lr3e-4,lr1e-4,answers [--steps 14] [--out benchmarks/out/kd_recipes.parquet]

Reads a finished run's model, teacher file, aligned heads (align-n<N>) and head ranking under DATA
(the pipeline's data/ folder), builds each student as distill_kd does (realigned on its own
stream by hybrid.realign unless --no-realign) and distills it with each recipe
(gna.students.kd.distill_logits) for each seed of --seeds, scoring the validation KV prompts
(the workflow's kd_validation set: a seed namespace of its own, hybrid.dict_size keys) before the
first step and every --every steps. Prints one row per student, recipe and seed (validation
accuracy after realignment, best with its step, last, lowest; seconds) and writes every point. A
recipe is the config's hybrid.kd with one change:
  today        hybrid.kd as configured
  lr<x>        learning rate x
  answers      the loss on answer positions only (weights 1 there, 0 elsewhere)
  tail         the teacher's top-k as they are, its remaining mass one more bin (hybrid.kd.tail_bin)
  steps<x>     x steps
  warmup<x>    the first x of the steps warm up (a share, e.g. warmup0.3; hybrid.kd.warmup)
  fp32         forward and backward in float32 (hybrid.kd.compute_dtype; default bfloat16 autocast)
  single       one document per window (BOS first where the tokenizer puts one), padded; the
               teacher's targets computed again on them
  whole        no weight on the positions of a document whose start the window cut off
  right        answer positions up-weighted only where the teacher's first choice is the answer token
  kv<x>        KD on a corpus whose documents are a share x KV prompts (hybrid.corpus.kv_share), built
               by today's code (its windows open with BOS where the tokenizer puts one); the
               teacher's targets and realignment's hidden states computed again on it (the aligned
               heads stay the run's)
  a+b          both changes
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "src")]

import polars as pl  # noqa: E402
import torch  # noqa: E402
import yaml  # noqa: E402

from gna.core.io import read_parquet, write_parquet  # noqa: E402
from gna.core.tensor_files import read_tensors  # noqa: E402
from gna.students.alignment import Realign, load_aligned, realign_in_context  # noqa: E402
from gna.students.corpus import separator  # noqa: E402
from gna.students.kd import KD, Selection, Watch, answer_weights, distill_logits, validation_scorer  # noqa: E402
from gna.students.mixer import restore  # noqa: E402
from gna.students.spec import make_hybrid, parse_variant, ranked_heads  # noqa: E402
from gna.tasks.tables import KD_VALIDATION, PROMPT_SETS_DIR, build_kv_retrieval, kv_prompt_sets  # noqa: E402
from gna.workflow.config import load_schema, validate_config  # noqa: E402


def recipe(name: str, kd: dict) -> tuple[dict, bool]:
    """(kd settings, answers only) of a recipe name."""
    if "+" in name:  # several changes at once: lr1e-4+answers
        settings, answers = dict(kd), False
        for part in name.split("+"):
            changed, only = recipe(part, kd)
            settings.update({k: v for k, v in changed.items() if v != kd.get(k)})
            answers = answers or only
        return settings, answers
    if name == "today":
        return dict(kd), False
    if name == "answers":
        return dict(kd), True
    if name == "tail":
        return {**kd, "tail_bin": True}, False
    if name.startswith("lr"):
        return {**kd, "lr": float(name[2:])}, False
    if name.startswith("steps"):
        return {**kd, "steps": int(name[5:])}, False
    if name == "fp32":
        return {**kd, "compute_dtype": "float32"}, False
    if name.startswith("warmup"):
        return {**kd, "warmup": float(name[6:])}, False
    if name.startswith("kv") or name in ("whole", "right", "single"):  # the corpus and weights, not hybrid.kd
        return dict(kd), False
    raise SystemExit(
        f"kd_recipes: unknown recipe {name!r} (today, answers, tail, fp32, lr<x>, steps<x>, warmup<x>, kv<x>)"
    )


def next_tokens(ids: torch.Tensor) -> torch.Tensor:
    """The token each position predicts (the last position: -1, none)."""
    return torch.cat([ids[:, 1:], torch.full((len(ids), 1), -1, dtype=ids.dtype)], 1)


def cut_documents(ids: torch.Tensor, sep: int) -> torch.Tensor:
    """Per window position: whether it belongs to a document that began before the window (up
    to and including the window's first separator; a whole window without one)."""
    is_sep = ids == sep
    seen = torch.cumsum(is_sep.int(), dim=1)
    return (seen == 0) | ((seen == 1) & is_sep)


def kv_share(name: str) -> float | None:
    """The corpus KV share a recipe name asks for (kv<x>, alone or in a+b), or None."""
    shares = [float(part[2:]) for part in name.split("+") if part.startswith("kv")]
    return shares[-1] if shares else None


def single_document_windows(tok, docs: tuple[list, list], corpus, seed: int) -> dict:
    """One document per window, as a prompt is scored: BOS first where the tokenizer puts one
    (gna.engine.scoring.starts_with_bos), the document, a separator, then padding; documents drawn
    as token_windows draws them. {"train": ids, "train_answers": predicts an answer token,
    "in_document": predicts a token of its own document (the loss's positions)}."""
    import random

    from gna.engine.scoring import starts_with_bos
    from gna.students.corpus import answer_tokens

    sep, seq_len = separator(tok), corpus.seq_len
    bos = [tok.bos_token_id] if starts_with_bos(tok) else []
    rng = random.Random(f"corpus-{seed}")
    mmlu_docs, kv_docs = list(docs[0]), list(docs[1])
    rng.shuffle(mmlu_docs)
    rng.shuffle(kv_docs)
    rows, answers, inside = [], [], []
    while len(rows) < corpus.train_windows and (mmlu_docs or kv_docs):
        use_kv = kv_docs and (not mmlu_docs or rng.random() < corpus.kv_share)
        ids, answer = answer_tokens(tok, *(kv_docs if use_kv else mmlu_docs).pop())
        ids, answer = (bos + ids + [sep])[:seq_len], ([False] * len(bos) + answer + [False])[:seq_len]
        pad = seq_len - len(ids)
        rows.append(ids + [sep] * pad)
        answers.append(answer[1:] + [False] * (pad + 1))
        inside.append([True] * (len(ids) - 1) + [False] * (pad + 1))
    return {"train": torch.tensor(rows), "train_answers": torch.tensor(answers), "in_document": torch.tensor(inside)}


def corpus_targets(model, tok, config: dict, mmlu_path: Path, share: float | None, single: bool = False) -> dict:
    """The teacher file's KD part (train_ids, train_answers, top_logp, top_idx) on the config's
    corpus with KV share `share` (None: the config's), built as distill_teacher does (the MMLU
    evaluation subset left out); `single`: one document per window (single_document_windows, with
    its in_document mask)."""
    from dataclasses import replace

    from gna.engine.precision import evaluated_in
    from gna.students.corpus import Corpus, MmluSelection, build_corpus, corpus_documents
    from gna.students.teacher_file import teacher_activations
    from gna.tasks.tables import load_mmlu_jsonl

    hy, mmlu = config["hybrid"], config["tasks"]["mmlu"]
    corpus = Corpus(**{k: tuple(v) if isinstance(v, list) else v for k, v in hy["corpus"].items()})
    corpus = corpus if share is None else replace(corpus, kv_share=share)
    _, pool = MmluSelection(mmlu["n"], mmlu["seed"], tuple(mmlu["topics"])).split(load_mmlu_jsonl(mmlu_path))
    template = config["tasks"]["kv_retrieval"]["template"]
    if single:
        windows = single_document_windows(
            tok, corpus_documents(pool, corpus, template, hy["seed"])["train"], corpus, hy["seed"]
        )
    else:
        windows = build_corpus(tok, pool, corpus, template, hy["seed"])
    with evaluated_in(model, config["eval"]["compute_dtype"]):
        # the hidden states realignment reads: its windows of the corpus
        realign_windows = hy["realign"]["windows"] or hy["corpus"]["align_windows"]
        acts = teacher_activations(
            model, windows["train"], hy["top_k_logits"], hidden_windows=realign_windows, progress=False
        )
    extra = {"in_document": windows["in_document"]} if single else {}
    return {"train_ids": windows["train"], "train_answers": windows["train_answers"], **acts, **extra}


def random_control(student, saved: dict, score, seed: int) -> pl.DataFrame:
    """Validation of the realigned student (saved[0]) moved, for each later snapshot of `saved`, by
    a random direction with the norm of KD's change up to it, tensor by tensor: does KD's direction
    matter, or would any step of that size do the same? Leaves the student at its last snapshot."""
    gen = torch.Generator().manual_seed(seed)
    start, rows = saved[0], []
    for step in sorted(saved):
        moved = {}
        for key, before in start.items():
            change = saved[step][key].float() - before.float()
            noise = torch.randn(before.shape, generator=gen)
            moved[key] = (before.float() + noise * change.norm() / noise.norm().clamp_min(1e-30)).to(before.dtype)
        restore(student, moved)
        correct, logp = score(student)
        rows.append({"after_steps": step, "accuracy": sum(correct) / len(correct), "mean_logp": logp})
    restore(student, saved[max(saved)])
    return pl.DataFrame(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default="data")
    ap.add_argument("--config", default="config/config.yaml")
    ap.add_argument("--model", required=True)
    ap.add_argument("--variants", default="k10-n16")
    ap.add_argument("--recipes", default="today")
    ap.add_argument("--steps", type=int, help="KD steps (default hybrid.kd.steps)")
    ap.add_argument("--every", type=int, default=1, help="KD steps between validation points")
    ap.add_argument("--seeds", default=None, help="comma-separated KD seeds (default hybrid.seed)")
    ap.add_argument("--no-realign", action="store_true", help="distill the aligned student as it is")
    ap.add_argument(
        "--random-control",
        action="store_true",
        help="also score, at each point, the realigned student moved by a random direction of the same norm "
        "(per parameter tensor) as KD's change up to that point: recipe '<recipe> random'",
    )
    ap.add_argument(
        "--mmlu", default=None, help="MMLU file of kv<x> recipes' corpora (default DATA/downloads/mmlu.jsonl)"
    )
    ap.add_argument("--out", default="benchmarks/out/kd_recipes.parquet")
    args = ap.parse_args()
    from gna.models.prepare import load_model

    config = validate_config(
        yaml.safe_load(Path(args.config).read_text()), load_schema(REPO / "config" / "schema.yaml")
    )
    hy = config["hybrid"]
    data = Path(args.data)
    torch.set_num_threads(2)
    keys = kv_prompt_sets(config)[f"{PROMPT_SETS_DIR}/{KD_VALIDATION}"]
    table = build_kv_retrieval(keys["sizes"], keys["n_per_size"], keys["seed"], keys["template"])
    seeds = [int(s) for s in args.seeds.split(",")] if args.seeds else [hy["seed"]]
    teacher = read_tensors(data / "distill" / args.model / "teacher.safetensors", None, "cpu")
    ranking = read_parquet(data / "results" / "heads" / args.model / "ranking.parquet")
    rows, summary, corpora = [], [], {}
    for variant in args.variants.split(","):
        k, n = parse_variant(variant)
        aligned = read_tensors(data / "distill" / args.model / f"align-n{n}.safetensors", None, "cpu")
        for name in args.recipes.split(","):
            for seed in seeds:
                kd, answers_only = recipe(name, hy["kd"])
                if args.steps:
                    kd["steps"] = args.steps
                start = time.perf_counter()
                model, tok = load_model(data / "models" / args.model, config["dtype"])
                share, single = kv_share(name), "single" in name.split("+")
                key = (share, single)
                if (share is not None or single) and key not in corpora:
                    mmlu_path = Path(args.mmlu or data / "downloads" / "mmlu.jsonl")
                    corpora[key] = corpus_targets(model, tok, config, mmlu_path, share, single)
                kd_data = corpora[key] if key in corpora else teacher
                student = load_aligned(make_hybrid(model, ranked_heads(ranking, k, args.model), n), aligned)
                if not args.no_realign and hy["realign"]["steps"]:
                    # on the KD corpus's windows: the run's teacher file, or a corpus built again
                    realign_in_context(student, kd_data["hidden"], Realign(**hy["realign"]), seed, progress=False)
                mask = kd_data["train_answers"]
                parts = name.split("+")
                if "right" in parts:  # up-weighted only where the teacher's first choice is the answer token
                    mask = mask & (kd_data["top_idx"][..., 0].long() == next_tokens(kd_data["train_ids"]))
                weights = mask.float() if answers_only else answer_weights(mask, kd["answer_weight"])
                if "in_document" in kd_data:  # single documents: no weight on the padding
                    weights = weights * kd_data["in_document"]
                if "whole" in parts:  # no weight on a document whose start the window cut off
                    weights = weights * ~cut_documents(kd_data["train_ids"], separator(tok))
                targets = {
                    "ids": kd_data["train_ids"],
                    "top_logp": kd_data["top_logp"],
                    "top_idx": kd_data["top_idx"],
                    "weights": weights,
                }
                score = validation_scorer(tok, table, config["eval"]["batch_size"], config["eval"]["compute_dtype"])
                select = Selection(score, every=args.every)
                steps = list(range(0, kd["steps"] + 1, args.every)) + [kd["steps"]]
                watch = Watch(
                    checkpoints=steps if args.random_control else (),
                    select=select,
                    desc=f"{variant} {name} seed {seed}",
                )
                curve, saved = distill_logits(student, targets, KD(**kd), seed, watch)
                seconds = time.perf_counter() - start
                if args.random_control:
                    rows.append(
                        random_control(student, saved, score, seed).with_columns(
                            pl.lit(variant).alias("variant"),
                            pl.lit(f"{name} random").alias("recipe"),
                            pl.lit(seed).alias("seed"),
                        )
                    )
                points = pl.DataFrame(select.rows).join(
                    curve.select(pl.col("step") + 1, "loss", "loss_answer", "loss_other", "grad_norm", "lr").rename(
                        {"step": "after_steps"}
                    ),
                    on="after_steps",
                    how="left",
                )
                labels = [pl.lit(variant).alias("variant"), pl.lit(name).alias("recipe"), pl.lit(seed).alias("seed")]
                rows.append(points.with_columns(*labels))
                best = points.sort(["accuracy", "mean_logp"], descending=True).row(0, named=True)
                summary.append(
                    {
                        "variant": variant,
                        "recipe": name,
                        "seed": seed,
                        "realigned": points["accuracy"][0],
                        "best": best["accuracy"],
                        "best_step": best["after_steps"],
                        "last": points["accuracy"][-1],
                        "min": points["accuracy"].min(),
                        "s_total": round(seconds, 1),
                    }
                )
                print(summary[-1], flush=True)
                print(points.select("after_steps", "accuracy", "mean_logp", "lr", "loss_answer", "grad_norm"))
    write_parquet(pl.concat(rows, how="diagonal_relaxed"), args.out)
    with pl.Config(tbl_rows=100, tbl_width_chars=200):
        print(pl.DataFrame(summary))


if __name__ == "__main__":
    main()
