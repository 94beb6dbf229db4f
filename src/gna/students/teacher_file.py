"""Distillation stage 1, the teacher file: the distillation corpus (gna.students.corpus: token
windows), the teacher's hidden state entering every layer and its top-k next-token log-probs —
computed once, shared by every student (run_distill_teacher). The stages of distillation
(MOHAWK-style, each a workflow rule so Snakemake caches it): this teacher file,
gna.students.alignment (per state size, and per student on its own stream), gna.students.kd (per
student, end to end). Only SSM parameters (HybridMixer.ssm_state) are trained; every teacher
weight stays frozen.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from gna.core import work
from gna.core.settings import Evaluation, Files, RuleSettings
from gna.core.tensor_files import compact, write_tensors
from gna.engine.anatomy import UnsupportedModel
from gna.engine.device import device_of
from gna.models.families import check_student_family, skip_hint
from gna.models.prepare import load_model
from gna.students.corpus import Corpus, MmluSelection, build_corpus
from gna.students.mixer import layers_of
from gna.tasks.tables import load_mmlu_jsonl

log = logging.getLogger("gna.students.teacher_file")


@torch.inference_mode()
def teacher_activations(
    model, ids: torch.Tensor, top_k: int, hidden_windows: int | None = None, batch: int = 4, progress: bool = True
) -> dict:
    """The teacher's top-k next-token log-probs at every position of the windows `ids` [n, T],
    and the hidden state entering each layer ([layers, hidden_windows, T, d], `compact`) of the
    first `hidden_windows` windows (None: all) — what layer alignment needs, while end-to-end
    distillation needs only the log-probs, so it can use many more windows at little cost."""
    layers = layers_of(model)
    n_hidden = len(ids) if hidden_windows is None else min(hidden_windows, len(ids))
    captured: list[torch.Tensor] = []

    def grab(module, args, kwargs):
        captured.append(args[0] if args else kwargs["hidden_states"])

    hooks = [layer.register_forward_pre_hook(grab, with_kwargs=True) for layer in layers]
    hidden, top_lp, top_ix = [], [], []
    try:
        for start in tqdm(range(0, len(ids), batch), desc="teacher activations", disable=not progress):
            captured.clear()
            logits = model(input_ids=ids[start : start + batch], use_cache=False).logits.float()
            tokens = ids[start : start + batch].numel()
            work.add(tokens, len(layers), tokens * sum(work.linear_flops(layer) for layer in layers))
            if start < n_hidden:
                hidden.append(compact(torch.stack(captured)[:, : n_hidden - start].float()))
            lp, ix = torch.log_softmax(logits, -1).topk(top_k, dim=-1)
            top_lp.append(lp)
            top_ix.append(ix.to(torch.int32))
    finally:
        for h in hooks:
            h.remove()
    return {
        "hidden": torch.cat(hidden, dim=1).contiguous(),  # float32 where any batch needed it
        "top_logp": torch.cat(top_lp),
        "top_idx": torch.cat(top_ix),
    }


@dataclass(frozen=True)
class DistillTeacher(RuleSettings):
    """Rule distill_teacher's settings: the `corpus` (hybrid.corpus) built with `seed` (hybrid.seed)
    and the KV `template` (tasks.kv_retrieval.template) outside the MMLU evaluation subset `mmlu`
    (tasks.mmlu n, seed, topics); the teacher's `top_k` next-token log-probs kept per position
    (hybrid.top_k_logits); how the teacher is loaded (`evaluation`: dtype, compute_dtype)."""

    corpus: Corpus = Corpus()
    top_k: int = 32
    seed: int = 99
    mmlu: MmluSelection = MmluSelection()
    template: str = "lookup"
    evaluation: Evaluation = Evaluation()


def run_distill_teacher(inputs: Files, outputs: Files, settings: DistillTeacher) -> None:
    """Build the corpus (gna.students.corpus.build_corpus, from the MMLU questions of inputs.mmlu
    outside the evaluation subset settings.mmlu) and write the teacher file outputs.teacher of the
    model inputs.model (its folder): teacher_activations on the train windows (hidden of the first
    settings.corpus.align_windows, top_logp, top_idx) plus the windows (train_ids, train_answers,
    heldout_ids). `settings.evaluation.compute_dtype`: the teacher's linear layers computed in it,
    as in every evaluation (gna.engine.precision.linears_computed_in)."""
    corpus, evaluation = settings.corpus, settings.evaluation
    model, tok = load_model(inputs.model, evaluation.dtype, compute_dtype=evaluation.compute_dtype)
    try:
        check_student_family(model)
    except UnsupportedModel as err:
        raise UnsupportedModel(f"{err}; {skip_hint(Path(inputs.model).name, 'hybrid')}") from None
    _, pool = settings.mmlu.split(load_mmlu_jsonl(inputs.mmlu))
    windows = build_corpus(tok, pool, corpus, settings.template, settings.seed)
    log.info(
        "corpus: %d train windows (%d answer positions; the first %d also for alignment) and %d held-out "
        "windows of %d tokens (%d MMLU questions outside the evaluation subset)",
        len(windows["train"]),
        int(windows["train_answers"].sum()),
        min(corpus.align_windows, len(windows["train"])),
        len(windows["heldout"]),
        corpus.seq_len,
        len(pool),
    )
    acts = teacher_activations(model, windows["train"].to(device_of(model)), settings.top_k, corpus.align_windows)
    write_tensors(
        {
            **acts,
            "train_ids": windows["train"],
            "train_answers": windows["train_answers"],
            "heldout_ids": windows["heldout"],
        },
        outputs.teacher,
    )
    log.info("teacher hidden states %s (%s)", tuple(acts["hidden"].shape), acts["hidden"].dtype)
