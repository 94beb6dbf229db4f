"""Bridge to EleutherAI's lm-evaluation-harness (lm-eval 0.4.x), using its real code.

* `make_lm` wraps an already-loaded model/tokenizer in lm-eval's HFLM (no second load).
* `evaluate_tasks` runs `lm_eval.simple_evaluate` on task names: the built-in registry (hub
  datasets such as "mmlu", "arc_easy") and/or YAML tasks found under `include_path`.
* `results_to_frame` turns the raw results dict into a tidy polars frame.
* `write_local_mmlu_task` writes our MMLU items (jsonl) plus an lm-eval task YAML whose 0-shot
  prompt is byte-identical to `tasks.build_mmlu(..., "letter", 0, ...)`, so lm-eval's numbers
  can be checked against `scoring.score_table` on the very same items;
  `write_crosscheck_task` writes the study's MMLU subset as that task (CROSSCHECK_TASK).

Metric naming in `results_to_frame`: lm-eval reports "acc,none" / "acc_stderr,none"; the part
before the comma becomes `metric` ("acc"), the part after it becomes `filter` ("none").
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import polars as pl

from gna.core.io import atomic_dir
from gna.core.settings import Files, RuleSettings
from gna.tasks.tables import LETTERS, MmluSelection, select_mmlu_file

if TYPE_CHECKING:
    from gna.engine.scoring import Scorer

log = logging.getLogger("gna.tasks.lmeval_bridge")

# lm-eval task name of our own MMLU letter items (see write_crosscheck_task)
CROSSCHECK_TASK = "gna_mmlu_letter"

# Same wording as lm_eval/tasks/mmlu/default/*.yaml and gna.tasks.tables.build_mmlu (letter format).
# lm-eval renders `description` as a Jinja template against each doc, so the topic can vary
# per item while keeping the header in the description (once, before any few-shot examples).
MMLU_DESCRIPTION = "The following are multiple choice questions (with answers) about {{topic}}.\n\n"
MMLU_DOC_TO_TEXT = "{{question.strip()}}\nA. {{answer_a}}\nB. {{answer_b}}\nC. {{answer_c}}\nD. {{answer_d}}\nAnswer:"
FRAME_COLUMNS = ("model", "task", "metric", "filter", "value", "stderr", "n")


# lm-eval computes logits at every position of a batch and their float32 log-softmax: about
# 12 bytes per (position, vocabulary entry) held at once (measured: a 262k-token vocabulary at
# batch 8 peaked at 12 GB)
LOGIT_BYTES = 12
ASSUMED_TOKENS = 2048  # the longest request of a task whose items are not ours to measure
RESERVED_MB = 1000  # the process, the tokenizer, lm-eval's own tables


def fitting_batch_size(model, requested: int, memory_mb: int | None, longest_tokens: int) -> int:
    """The largest batch size up to `requested` whose logits fit in `memory_mb` (the job's
    memory) next to the weights; 1 at least (a warning says when even that does not fit)."""
    if memory_mb is None:
        return requested
    vocab = model.get_output_embeddings().weight.shape[0]
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    spare = (memory_mb - RESERVED_MB) * 2**20 - weights
    per_sequence = longest_tokens * vocab * LOGIT_BYTES
    fits = int(spare // per_sequence) if spare > 0 else 0
    if fits < 1:
        log.warning(
            "lm-eval's logits of one %d-token request over %d vocabulary entries (%.0f MB) do not fit in "
            "the job's %d MB next to the weights; raise the rule's mem_mb",
            longest_tokens,
            vocab,
            per_sequence / 2**20,
            memory_mb,
        )
    batch = max(1, min(requested, fits))
    if batch < requested:
        log.info(
            "lm-eval batch size %d instead of %d: %d-token requests over %d vocabulary entries in %d MB",
            batch,
            requested,
            longest_tokens,
            vocab,
            memory_mb,
        )
    return batch


def longest_request(tok, items_file: str | Path) -> int:
    """An upper bound of the tokens of the longest request of our MMLU items (`items_file`, one
    JSON item per line): the item's text and a margin for the description and prompt words."""
    with open(items_file) as handle:
        return max(len(tok(line, add_special_tokens=False)["input_ids"]) for line in handle) + 64


def make_lm(model, tok, batch_size: int = 8):
    """lm-eval HFLM around an already-instantiated transformers model (kept on its device).

    With a model instance HFLM ignores `device` and uses `model.device`; the model must be a
    causal LM (HFLM infers the backend from the config)."""
    from lm_eval.models.huggingface import HFLM

    from gna.engine.scoring import starts_with_bos

    # BOS exactly where the engine puts it, so the cross-check compares the same token sequences
    return HFLM(
        pretrained=model,
        tokenizer=tok,
        batch_size=int(batch_size),
        device=str(model.device),
        add_bos_token=starts_with_bos(tok),
    )


def _task_manager(include_path: str | Path | None, include_defaults: bool):
    from lm_eval.tasks import TaskManager

    if not include_defaults and not include_path:
        raise ValueError("evaluate_tasks: include_defaults=False needs an include_path with task YAMLs")
    if include_path is not None and not Path(include_path).is_dir():
        raise FileNotFoundError(f"lm-eval include_path is not a directory: {include_path}")
    return TaskManager(include_path=str(include_path) if include_path else None, include_defaults=include_defaults)


def check_task_names(task_manager, tasks: list[str], searched: str = "lm-eval's task index") -> None:
    """Raise ValueError naming every task that lm-eval does not know (names or YAML paths)."""
    if isinstance(tasks, str) or not tasks:
        raise ValueError(f"tasks must be a non-empty list of task names, got {tasks!r}")
    known = set(task_manager.all_tasks)
    unknown = [t for t in tasks if t not in known and not (t.endswith((".yaml", ".yml")) and Path(t).is_file())]
    if unknown:
        raise ValueError(
            f"unknown lm-eval task(s) {unknown} (searched {searched}); list the known names with "
            "`lm-eval ls tasks` (add `--include_path DIR` for local YAML tasks) or "
            "`lm_eval.tasks.TaskManager(include_path=...).all_tasks`"
        )


@dataclass(frozen=True)
class LmEvalOptions:
    """How lm-eval finds and runs its tasks (config section lm_eval): the folder of extra task
    YAMLs `include_path` (resolved against the workflow folder; None: none), whether lm-eval's
    built-in tasks load too (`include_defaults`), at most `limit` items per task and
    `num_fewshot` examples (None: lm-eval's own)."""

    include_path: str | None = None
    include_defaults: bool = True
    limit: int | None = None
    num_fewshot: int | None = None


def evaluate_tasks(
    scorer: Scorer, tasks: list[str], options: LmEvalOptions = LmEvalOptions(), log_samples: bool = False
) -> dict:
    """Evaluate `tasks` with lm_eval.simple_evaluate on the scorer's model and tokenizer,
    `scorer.batch_size` requests at a time (a caller with a memory limit picks it with
    fitting_batch_size), as `options` say; returns its raw results dict.

    Hub tasks ("mmlu", "arc_easy", ...) download their datasets through `datasets` on first use
    (needs network or a populated HF cache). Per-sample outputs are under results["samples"]
    only when log_samples=True."""
    import lm_eval

    include_path, include_defaults, batch_size = options.include_path, options.include_defaults, scorer.batch_size
    tasks = list(tasks) if not isinstance(tasks, str) else tasks
    task_manager = _task_manager(include_path, include_defaults)
    searched = " and ".join(
        ([f"include_path={include_path}"] if include_path else [])
        + (["lm-eval's built-in tasks"] if include_defaults else [])
    )
    check_task_names(task_manager, tasks, searched)
    lm = make_lm(scorer.model, scorer.tok, batch_size=batch_size)
    results = lm_eval.simple_evaluate(
        model=lm,
        tasks=tasks,
        num_fewshot=options.num_fewshot,
        limit=options.limit,
        batch_size=batch_size,
        log_samples=log_samples,
        task_manager=task_manager,
    )
    if results is None:  # only non-zero ranks in a distributed run
        raise RuntimeError("lm_eval.simple_evaluate returned no results")
    return results


def _number(value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def results_to_frame(results: dict, model_name: str) -> pl.DataFrame:
    """One row per (task, metric, filter): model, task, metric, filter, value, stderr, n.

    Metric keys "acc,none" -> metric "acc", filter "none"; "*_stderr" entries become the
    `stderr` column of their metric (null where lm-eval reports "N/A"); keys without a
    ",filter" part ("alias", "name", "sample_len") and non-numeric values are skipped. `n` is lm-eval's effective
    sample count (for a group, the sum over its subtasks that are in the results)."""
    per_task = results.get("results", {})
    n_samples = results.get("n-samples", {})
    group_subtasks = results.get("group_subtasks", {})

    def n_of(task: str) -> int | None:
        if task in n_samples:
            return int(n_samples[task]["effective"])
        subs = [n_of(s) for s in group_subtasks.get(task, [])]
        subs = [s for s in subs if s is not None]
        return sum(subs) if subs else None

    rows = []
    for task, metrics in per_task.items():
        for key, value in metrics.items():
            name, comma, filt = key.partition(",")
            if not comma or name.endswith("_stderr") or _number(value) is None:
                continue
            stderr = _number(metrics.get(f"{name}_stderr,{filt}"))
            if stderr is not None and math.isnan(stderr):
                stderr = None
            rows.append(
                {
                    "model": model_name,
                    "task": task,
                    "metric": name,
                    "filter": filt,
                    "value": float(value),
                    "stderr": stderr,
                    "n": n_of(task),
                }
            )
    schema = {
        "model": pl.String,
        "task": pl.String,
        "metric": pl.String,
        "filter": pl.String,
        "value": pl.Float64,
        "stderr": pl.Float64,
        "n": pl.Int64,
    }
    return pl.DataFrame(rows, schema=schema).sort(["task", "metric", "filter"])


def _yaml_dumper():
    import yaml

    class Dumper(yaml.SafeDumper):
        pass

    def str_style(dumper, text):  # "\n" escapes on one line instead of folded blocks
        return dumper.represent_scalar("tag:yaml.org,2002:str", text, style='"' if "\n" in text else None)

    Dumper.add_representer(str, str_style)
    return Dumper


MMLU_ITEM_COLUMNS = (
    "question_id",
    "question",
    "answer_a",
    "answer_b",
    "answer_c",
    "answer_d",
    "correct_answer",
    "topic",
)


def _check_mmlu_items(items: pl.DataFrame, task_name: str) -> None:
    """Raise ValueError unless `items` are non-empty MMLU rows with letter answers and
    `task_name` is usable as an lm-eval task and file name."""
    missing = [c for c in MMLU_ITEM_COLUMNS if c not in items.columns]
    if missing:
        raise ValueError(f"write_local_mmlu_task: items lack columns {missing}")
    if items.is_empty():
        raise ValueError("write_local_mmlu_task: no items")
    if not task_name.replace("_", "").replace("-", "").isalnum():
        raise ValueError(f"task name {task_name!r}: use letters, digits, '_' or '-'")
    bad = items.filter(~pl.col("correct_answer").is_in(list(LETTERS)))
    if not bad.is_empty():
        raise ValueError(f"correct_answer must be one of {LETTERS}; question_ids {bad['question_id'].to_list()}")


def _write_mmlu_task_yaml(task_name: str, data_file: Path, yaml_dir: Path) -> Path:
    """Write `yaml_dir/{task_name}.yaml`, the task of the MMLU items in `data_file`; return its path."""
    import yaml

    yaml_path = yaml_dir / f"{task_name}.yaml"
    with open(yaml_path, "w") as handle:
        yaml.dump(
            _mmlu_task_config(task_name, data_file),
            handle,
            Dumper=_yaml_dumper(),
            sort_keys=False,
            allow_unicode=True,
            width=1000,
        )
    return yaml_path


def _mmlu_task_config(task_name: str, data_file: Path) -> dict:
    """The lm-eval task YAML (as a dict) of MMLU letter items stored in the jsonl `data_file`."""
    return {
        "task": task_name,
        "dataset_path": "json",
        "dataset_name": None,
        "dataset_kwargs": {"data_files": {"test": str(data_file)}},
        "test_split": "test",
        "output_type": "multiple_choice",
        "description": MMLU_DESCRIPTION,
        "doc_to_text": MMLU_DOC_TO_TEXT,
        "doc_to_choice": list(LETTERS),
        "doc_to_target": "answer",
        "target_delimiter": " ",
        "metric_list": [{"metric": "acc", "aggregation": "mean", "higher_is_better": True}],
        "metadata": {"version": 1.0},
    }


def write_local_mmlu_task(items: pl.DataFrame, task_dir: Path, task_name: str, final_dir: Path | None = None) -> Path:
    """Write `task_dir/{task_name}.jsonl` and `task_dir/{task_name}.yaml`; return the YAML path.

    `items` are rows of tasks.load_mmlu_jsonl / select_mmlu (question_id, question,
    answer_a..answer_d, correct_answer, topic). The task mirrors lm-eval's
    mmlu/default/_default_template_yaml (letter choices after "Answer:", target_delimiter " ")
    with a per-item topic in the description, so its 0-shot context equals
    build_mmlu(items, pool, "letter", 0, seed). Docs keep the input order (sort by
    question_id beforehand if needed); doc i of lm-eval's samples is row i of `items`.
    `final_dir`: where the folder will live when it is written to a temporary folder first; the
    YAML names its data file under it as given (a relative `final_dir` gives a relative path, which
    lm-eval reads from the working directory), else by absolute path.
    Few-shot (num_fewshot > 0) is lm-eval's own sampling from this same split, not build_mmlu's
    pool, so only 0-shot is comparable."""
    _check_mmlu_items(items, task_name)
    task_dir = Path(task_dir).resolve()
    task_dir.mkdir(parents=True, exist_ok=True)
    data_path = task_dir / f"{task_name}.jsonl"
    with open(data_path, "w") as handle:
        for row in items.select(MMLU_ITEM_COLUMNS).iter_rows(named=True):
            row["answer"] = LETTERS.index(row["correct_answer"])  # gold index, as cais/mmlu's
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")

    named_dir = Path(final_dir) if final_dir is not None else task_dir
    return _write_mmlu_task_yaml(task_name, named_dir / data_path.name, task_dir)


def crosscheck_task_yaml(task_dir: str | Path, yaml_dir: str | Path) -> Path:
    """Write the YAML of the cross-check task in `task_dir` (write_crosscheck_task) into the folder
    `yaml_dir`, naming that task folder's data file where it is now: lm-eval wants the data file
    by absolute path, so a YAML written when the task was made reads the old checkout's items
    after the project moves (or a copy restored by `dvc pull`); one written by the job that runs
    it cannot."""
    data_file = Path(task_dir).resolve() / f"{CROSSCHECK_TASK}.jsonl"
    if not data_file.is_file():
        raise FileNotFoundError(f"missing input file: {data_file}")
    return _write_mmlu_task_yaml(CROSSCHECK_TASK, data_file, Path(yaml_dir))


def write_crosscheck_task(
    mmlu_path: str | Path, sha256: str | None, selection: MmluSelection, out_dir: str | Path
) -> Path:
    """Write the lm-eval task CROSSCHECK_TASK into the folder `out_dir` (atomically): the same
    MMLU subset as the study's own MMLU tasks (file `mmlu_path` checked against `sha256`, the
    questions `selection` picks: tasks.mmlu keys n, seed, topics). Returns the task YAML's final
    path. Its data file
    is named by `out_dir` as given: the workflow's relative data/tasks/… path keeps the folder's
    bytes (and DVC's hash of data/tasks) the same in every checkout, and lm-eval run by hand from
    the project folder finds the items; the cross-check job writes its own YAML with the absolute
    path (crosscheck_task_yaml)."""
    subset, _ = select_mmlu_file(mmlu_path, sha256, selection)
    with atomic_dir(out_dir) as tmp:
        yaml_name = write_local_mmlu_task(subset, tmp, CROSSCHECK_TASK, final_dir=out_dir).name
    log.info("wrote lm-eval task %s with %d items", CROSSCHECK_TASK, len(subset))
    return Path(out_dir) / yaml_name


@dataclass(frozen=True)
class LmevalCrosscheckTask(RuleSettings):
    """Rule lmeval_crosscheck_task: the MMLU questions the study evaluates (`mmlu`: tasks.mmlu
    keys n, seed, topics) from the file pinned by `sha256` (tasks.mmlu.data.sha256; None: no pin)."""

    mmlu: MmluSelection = MmluSelection()
    sha256: str | None = None


def run_lmeval_crosscheck_task(inputs: Files, outputs: Files, settings: LmevalCrosscheckTask) -> Path:
    """Rule lmeval_crosscheck_task: writes the questions of the inputs' `mmlu` (the MMLU jsonl)
    that settings.mmlu selects as the lm-eval task folder of the outputs' `task_dir`
    (write_crosscheck_task); returns the task YAML's path."""
    return write_crosscheck_task(inputs.mmlu, settings.sha256, settings.mmlu, outputs.task_dir)
