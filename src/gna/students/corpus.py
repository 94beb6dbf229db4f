"""The distillation corpus (offline default): MMLU questions outside the evaluation subset, with
their answers, and synthetic KV-retrieval prompts with their answers, from a seed namespace the
evaluation never uses, joined into token windows; held-out windows (other questions, other
seeds) measure perplexity. Each window comes with a mask of the positions that predict an
answer token, so distillation can weight them (gna.students.kd.distill_logits)."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import polars as pl
import torch

from gna.core.io import read_parquet, write_json
from gna.core.settings import Files, RuleSettings
from gna.tasks.tables import build_kv_retrieval, build_mmlu, load_mmlu_jsonl, select_mmlu


@dataclass(frozen=True)
class Corpus:
    """The distillation corpus (config block hybrid.corpus): windows of `seq_len` tokens,
    `train_windows` for distillation (the first `align_windows` also for alignment) and
    `heldout_windows` for perplexity; KV documents over dictionary sizes `kv_sizes`, a `kv_share`
    of the documents (the rest answered MMLU questions), `heldout_share` of the MMLU pool held out."""

    seq_len: int = 256
    train_windows: int = 128
    align_windows: int = 32
    heldout_windows: int = 8
    kv_sizes: tuple[int, ...] = (5, 10, 20)
    kv_share: float = 0.5
    heldout_share: float = 0.2


@dataclass(frozen=True)
class MmluSelection:
    """The MMLU evaluation subset the corpus stays out of (config keys tasks.mmlu.n, seed, topics;
    gna.tasks.tables.select_mmlu)."""

    n: int | None = 200
    seed: int = 1234
    topics: tuple[str, ...] = ()

    def split(self, table: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
        """(evaluation subset, remaining pool) of the MMLU `table`."""
        return select_mmlu(table, self.n, self.seed, list(self.topics))


def answered_mmlu(pool: pl.DataFrame, seed: int) -> list[tuple[str, str]]:
    """(question in letter format, its answer letter) for each MMLU question of `pool`."""
    if not len(pool):
        return []
    return [
        (row["context"], row["choices"][row["target"]])
        for row in build_mmlu(pool, pool, "letter", 0, seed).iter_rows(named=True)
    ]


def corpus_kv_seed(split: str, seed: int) -> str:
    """The KV seed of a corpus split: a string namespace, while evaluation items are drawn from
    integer seeds, so no corpus prompt can be an evaluation prompt whatever the config's seeds."""
    return f"corpus-{split}-{seed}"


def answered_kv(sizes: list[int], n: int, seed: int | str, template: str) -> list[tuple[str, str]]:
    """At least `n` (KV-retrieval prompt, its answer) pairs spread over dictionary `sizes`."""
    per_size = max(1, math.ceil(n / len(sizes)))
    return [
        (row["context"], row["choices"][row["target"]])
        for row in build_kv_retrieval(sizes, per_size, seed, template).iter_rows(named=True)
    ]


def answer_tokens(tok, context: str, answer: str) -> tuple[list[int], list[bool]]:
    """Tokens of context + answer and, per token, whether it belongs to the answer (the tokens
    after the longest prefix shared with the context's own tokens)."""
    full = tok(context + answer, add_special_tokens=False)["input_ids"]
    ctx = tok(context, add_special_tokens=False)["input_ids"]
    shared = 0
    while shared < min(len(ctx), len(full)) and ctx[shared] == full[shared]:
        shared += 1
    return full, [i >= shared for i in range(len(full))]


def separator(tok) -> int:
    """The token between two documents of the corpus stream: the tokenizer's EOS (0 without one)."""
    return tok.eos_token_id if tok.eos_token_id is not None else 0


def token_windows(
    tok,
    mmlu_docs: list[tuple[str, str]],
    kv_docs: list[tuple[str, str]],
    corpus: Corpus,
    n_windows: int,
    seed: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Documents (context, answer) drawn at random (KV with probability corpus.kv_share), joined by
    EOS and cut into `n_windows` windows of corpus.seq_len tokens, each opened by BOS where the
    tokenizer puts one before a text (starts_with_bos: Gemma's does), as every prompt the students
    are scored on is. Returns (ids [n_windows, seq_len], predicts_answer [n_windows, seq_len]
    bool: the next token is an answer token)."""
    from gna.engine.scoring import starts_with_bos

    kv_share, seq_len = corpus.kv_share, corpus.seq_len
    sep = separator(tok)
    # a window without it is out of distribution for such a model: its first position takes the
    # attention that BOS takes in every prompt, and the teacher's targets there and after it are
    # a different model's (Gemma 3: distillation on such windows cost the students retrieval)
    bos = [tok.bos_token_id] if starts_with_bos(tok) else []
    body = seq_len - len(bos)
    rng = random.Random(f"corpus-{seed}")
    mmlu_docs, kv_docs = list(mmlu_docs), list(kv_docs)
    rng.shuffle(mmlu_docs)
    rng.shuffle(kv_docs)
    need = body * n_windows
    stream: list[int] = []
    is_answer: list[bool] = []
    while len(stream) < need and (mmlu_docs or kv_docs):
        use_kv = kv_docs and (not mmlu_docs or rng.random() < kv_share)
        ids, answer = answer_tokens(tok, *(kv_docs if use_kv else mmlu_docs).pop())
        stream += ids + [sep]
        is_answer += answer + [False]
    if len(stream) < need:
        raise ValueError(
            f"distillation corpus too small: {len(stream)} tokens, {need} needed for {n_windows} "
            f"windows of {seq_len} (lower hybrid.corpus.train_windows / heldout_windows / seq_len)"
        )
    ids = torch.tensor(stream[:need]).view(n_windows, body)
    if bos:
        ids = torch.cat([torch.full((n_windows, 1), bos[0], dtype=ids.dtype), ids], 1)
    # position t of window w predicts the window's token t + 1, stream token w * body + t + 1 - len(bos)
    # (BOS predicts the body's first; the last position, the next window's first)
    flags = torch.tensor(is_answer[: need + 1] + [False] * (need + 1 - len(is_answer)))
    return ids, flags[torch.arange(n_windows)[:, None] * body + torch.arange(seq_len)[None, :] + 1 - len(bos)]


def check_no_evaluation_items(corpus_texts, evaluation_texts, what: str) -> None:
    """Refuse a corpus that holds an evaluation item: any of `corpus_texts` among
    `evaluation_texts` raises, naming `what` and how many (distillation on the test set would
    make every student score meaningless)."""
    evaluation = set(evaluation_texts)
    leaked = [t for t in corpus_texts if t in evaluation]
    if leaked:
        raise ValueError(
            f"distillation corpus: {len(leaked)} {what} are evaluation items (first: {leaked[0][:80]!r}); "
            "the corpus must never contain what the students are scored on"
        )


def split_pool(pool: pl.DataFrame, heldout_share: float) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(train, held-out) questions: the first `heldout_share` of the pool is held out."""
    n_held = int(round(len(pool) * heldout_share))
    return pool[n_held:], pool[:n_held]


def corpus_splits(corpus: Corpus, seed: int) -> list[tuple[str, int, int]]:
    """(split, windows, seed) of the corpus's "train" and "heldout" splits."""
    return [("train", corpus.train_windows, seed), ("heldout", corpus.heldout_windows, seed + 1)]


def corpus_documents(mmlu_pool: pl.DataFrame, corpus: Corpus, template: str, seed: int) -> dict:
    """{split: (MMLU documents, KV documents)} for each of corpus_splits, each a list of
    (context, answer): disjoint question halves of `mmlu_pool` and KV seed namespaces."""
    pools = dict(zip(("train", "heldout"), split_pool(mmlu_pool, corpus.heldout_share)))
    docs = {}
    for split, n, split_seed in corpus_splits(corpus, seed):
        n_kv = corpus.seq_len * n // 16 if corpus.kv_share > 0 else 0  # more than enough documents
        kv_docs = answered_kv(list(corpus.kv_sizes), n_kv, corpus_kv_seed(split, seed), template) if n_kv else []
        docs[split] = (answered_mmlu(pools[split], split_seed), kv_docs)
    return docs


def build_corpus(tok, mmlu_pool: pl.DataFrame, corpus: Corpus, template: str, seed: int) -> dict:
    """Train and held-out windows {"train": [n, T], "train_answers": [n, T] bool (positions that
    predict an answer token), "heldout": [m, T]} from corpus_documents (the MMLU evaluation
    subset is never in `mmlu_pool`; run_distill_corpus_check checks the whole corpus against the
    evaluation items)."""
    docs = corpus_documents(mmlu_pool, corpus, template, seed)
    out = {}
    for split, n, split_seed in corpus_splits(corpus, seed):
        out[split], answers = token_windows(tok, *docs[split], corpus, n, split_seed)
        if split == "train":
            out["train_answers"] = answers
    return out


@dataclass(frozen=True)
class DistillCorpusCheck(RuleSettings):
    """Rule distill_corpus_check's settings: the `corpus` (hybrid.corpus) built with `seed`
    (hybrid.seed) and the KV `template` (tasks.kv_retrieval.template), outside the MMLU evaluation
    subset `mmlu` (tasks.mmlu n, seed, topics)."""

    corpus: Corpus = Corpus()
    seed: int = 99
    mmlu: MmluSelection = MmluSelection()
    template: str = "lookup"


def run_distill_corpus_check(inputs: Files, outputs: Files, settings: DistillCorpusCheck) -> dict:
    """Check that the distillation corpus (corpus_documents, from the MMLU questions of inputs.mmlu
    outside the evaluation subset settings.mmlu) holds no evaluation item: no MMLU question of the
    subset (by text) and no KV prompt of the evaluation table inputs.kv; and that the KV prompts
    of checkpoint selection inputs.validation are neither evaluation prompts nor corpus documents;
    raises otherwise (check_no_evaluation_items). Writes what was checked to the JSON outputs.check.
    Model-free and apart from the teacher file, so an edit of the evaluation tasks reruns this
    check, not the distillation."""
    corpus, seed, template = settings.corpus, settings.seed, settings.template
    subset, pool = settings.mmlu.split(load_mmlu_jsonl(inputs.mmlu))
    evaluation_kv = read_parquet(inputs.kv)["context"]
    validation_kv = read_parquet(inputs.validation)["context"]
    check_no_evaluation_items(validation_kv, evaluation_kv, "KV prompts of checkpoint selection")
    counts = {
        "evaluation_mmlu_questions": len(subset),
        "evaluation_kv_prompts": len(evaluation_kv),
        "validation_kv_prompts": len(validation_kv),
    }
    for split, (mmlu_docs, kv_docs) in corpus_documents(pool, corpus, template, seed).items():
        check_no_evaluation_items([c for c, _ in kv_docs], evaluation_kv, f"{split} KV-retrieval prompts")
        check_no_evaluation_items([c for c, _ in kv_docs], validation_kv, f"{split} KV-retrieval prompts (validation)")
        counts[f"{split}_kv_prompts"] = len(kv_docs)
        counts[f"{split}_mmlu_documents"] = len(mmlu_docs)
    check_no_evaluation_items(pool["question"], subset["question"], "MMLU questions of the corpus pool")
    counts["corpus_pool_mmlu_questions"] = len(pool)
    write_json(counts | {"leaked": 0}, outputs.check)
    return counts
