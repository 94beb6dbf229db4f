"""The knowledge task family: simple world facts, asked in cloze and in multiple-choice form.

Facts are (relation, subject, object) triples read from data files that PyPI wheels ship
(countryinfo: capitals, continents, demonyms; periodictable: chemical symbols), each wheel
checksum-pinned, or from a local CSV with those three columns. From them:

* `facts_cloze` — knowledge only: "The capital of France is" → " Paris" among four options,
  scored by log-likelihood as MMLU cloze is;
* `facts_choice` — knowledge plus the in-context step: the same question with the same four
  options listed as "A. … D." lines, answered with the letter (`answer: letter`, MMLU's format)
  or with the option's own text (`answer: text`), after solved examples of the same relation
  (a ChoiceForm says how: answer, shots, option marker, chat template, "The answer is" prefix,
  which draw of examples, and a rotation of the options for the circular check);
* the known items: per model, the multiple-choice items whose cloze twin (same fact, same
  options) the model gets right by at least `known_margin` nats over the best wrong option,
  so the multiple-choice score measures the in-context step on knowledge the model has.

Item i of both formats is the same fact with the same options in the same order. Confounds the
builder rules out: a subject with two correct answers (a transcontinental country) is never asked
and never an example; a solved example never makes one option string more frequent in the context
than another; every item says whether its answer can be copied from the subject's letters
(`copyable`), so knowledge can be read on the items where it cannot. The development split
(`split="dev"`) holds other facts than the evaluation split, for choosing a format; the evaluation
split does not depend on it.
"""

from __future__ import annotations

import ast
import csv
import io
import json
import logging
import random
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from gna.core.io import read_parquet, write_parquet
from gna.core.settings import Files, RuleSettings
from gna.models.sources import SourceError, download_wheel, resolve_local, verify_sha256

log = logging.getLogger("gna.tasks.facts")

FACT_FORMATS = ("cloze", "choice")
CHOICE_ANSWERS = ("letter", "text")
LETTERS = ("A", "B", "C", "D")
KNOWN, UNKNOWN = "known", "unknown"
FACT_COLUMNS = ("relation", "subject", "object", "source")
MARKERS = {"dot": "{letter}. {option}", "paren": "({letter}) {option}"}
ANSWER_PREFIX = "The answer is"
SPLITS = ("eval", "dev")

# Countries whose territory lies on two continents: countryinfo records one region each, so the
# other is added here (a second correct answer) and the fact is then never asked as an item.
TRANSCONTINENTAL = {
    "Armenia": "Europe",
    "Azerbaijan": "Europe",
    "Cyprus": "Europe",
    "East Timor": "Oceania",
    "Egypt": "Asia",
    "Georgia": "Europe",
    "Indonesia": "Oceania",
    "Kazakhstan": "Europe",
    "Russia": "Asia",
    "Turkey": "Europe",
}


@dataclass(frozen=True)
class Relation:
    cloze: str  # a sentence stem the answer completes
    question: str  # the same fact as a question, for the multiple-choice form


RELATIONS = {
    "capital": Relation("The capital of {subject} is", "What is the capital of {subject}?"),
    "continent": Relation("{subject} is a country in", "On which continent is {subject}?"),
    "demonym": Relation("The people of {subject} are called", "What are the people of {subject} called?"),
    "symbol": Relation("The chemical symbol for {subject} is", "What is the chemical symbol for {subject}?"),
}


def _countryinfo(archive: zipfile.ZipFile, source: str) -> list[tuple]:
    """Capitals, continents (the Americas as one) and demonyms of countryinfo's country files."""
    rows = []
    for name in sorted(archive.namelist()):
        if not (name.startswith("countryinfo/data/") and name.endswith(".json")):
            continue
        country = json.loads(archive.read(name))
        subject = country.get("name")
        if not isinstance(subject, str) or not subject:
            continue
        capital, region, demonym = country.get("capital"), country.get("region"), country.get("demonym")
        # a capital that repeats the country's name ("Mexico City") is answered by copying, not known
        if isinstance(capital, str) and capital and subject.split()[0].lower() not in capital.lower():
            rows.append(("capital", subject, capital, source))
        if isinstance(region, str) and region:
            rows.append(("continent", subject, "the Americas" if region == "Americas" else region, source))
            if TRANSCONTINENTAL.get(subject, region) != region:
                rows.append(("continent", subject, TRANSCONTINENTAL[subject], f"{source} + gna.tasks.facts"))
        if isinstance(demonym, str) and demonym:
            rows.append(("demonym", subject, demonym.split(",")[0].strip(), source))
    return rows


def _periodictable(archive: zipfile.ZipFile, source: str) -> list[tuple]:
    """Element name → symbol from periodictable's `element_base` table, read as data (never imported)."""
    tree = ast.parse(archive.read("periodictable/core.py"))
    for node in tree.body:
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", None) == "element_base":
            table = ast.literal_eval(node.value)
            return [
                ("symbol", name.capitalize(), symbol, source)
                for number, (name, symbol, *_) in sorted(table.items())
                if number > 0
            ]
    raise SourceError(f"{source}: periodictable/core.py has no element_base table")


READERS = {"countryinfo": _countryinfo, "periodictable": _periodictable}


def facts_frame(rows: list[tuple]) -> pl.DataFrame:
    """The facts as one table; a subject may have several answers for a relation (select_facts
    never asks those)."""
    return (
        pl.DataFrame(rows, schema=list(FACT_COLUMNS), orient="row")
        .unique(subset=["relation", "subject", "object"], keep="first", maintain_order=True)
        .sort("relation", "subject", "object")
    )


_SAID_NEVER_ASKED: set[tuple[str, frozenset]] = set()


def single_answer(facts: pl.DataFrame, relation: str) -> list[dict]:
    """The facts of `relation` whose subject has exactly one answer, sorted by subject."""
    rows = facts.filter(pl.col("relation") == relation)
    counts = rows.group_by("subject").len()
    multi = set(counts.filter(pl.col("len") > 1)["subject"])
    if multi and (relation, frozenset(multi)) not in _SAID_NEVER_ASKED:  # once per process: a job selects many times
        _SAID_NEVER_ASKED.add((relation, frozenset(multi)))
        log.info("%s: %d subjects with more than one answer are never asked: %s", relation, len(multi), sorted(multi))
    return rows.filter(~pl.col("subject").is_in(sorted(multi))).sort("subject").rows(named=True)


def copyable(subject: str, answer: str) -> bool:
    """Whether `answer` can be written from the letters of `subject` without knowing the fact: it
    starts with the subject's first three letters (German ← Germany), or it is a code of at most
    three letters found in order in the subject, its first letter first (Mg ← Magnesium)."""
    subj, ans = subject.lower(), answer.lower()
    if len(ans) <= 3 and ans and ans[0] == subj[0]:
        rest = iter(subj[1:])
        return all(letter in rest for letter in ans[1:])
    return len(subj) >= 3 and ans.startswith(subj[:3])


def read_wheel_facts(wheel: str | Path, reader: str, source: str) -> pl.DataFrame:
    """The facts `reader` (a READERS name) reads from the wheel file `wheel`."""
    if reader not in READERS:
        raise ValueError(f"unknown facts reader {reader!r}; allowed: {', '.join(READERS)}")
    with zipfile.ZipFile(wheel) as archive:
        return facts_frame(READERS[reader](archive, source))


def read_local_facts(path: str | Path, sha256: str | None = None) -> pl.DataFrame:
    """Facts from a local CSV with columns relation, subject, object (checked against `sha256`)."""
    path, _ = resolve_local(path, "tasks.facts.data.path", sha256)
    with open(path, newline="") as handle:
        reader = csv.DictReader(io.StringIO(handle.read()))
        missing = {"relation", "subject", "object"} - set(reader.fieldnames or [])
        if missing:
            raise ValueError(f"{path}: missing columns {sorted(missing)} (needs relation, subject, object)")
        rows = [(r["relation"], r["subject"], r["object"], path.name) for r in reader]
    if not rows:
        raise ValueError(f"{path}: no facts")
    return facts_frame(rows)


@dataclass(frozen=True)
class FactsWheel:
    """One pinned wheel of facts: `package`==`version`, checked against `sha256`, its facts read
    by `reader` (READERS)."""

    package: str
    version: str
    reader: str
    sha256: str


@dataclass(frozen=True)
class FactsData:
    """Where the facts come from (config block tasks.facts.data): `source` 'pypi-wheels' (the
    pinned `wheels`) or 'local' (the CSV at `path`, checked against `sha256` where given)."""

    source: str = "pypi-wheels"
    wheels: tuple[FactsWheel, ...] = ()
    path: str | None = None
    sha256: str | None = None


def fetch_facts(data: FactsData, out_path: str | Path, local_path: str | Path | None = None) -> pl.DataFrame:
    """The facts of `data` (the `tasks.facts.data` config block) as one Parquet table (relation,
    subject, object, source) at `out_path`: each pinned wheel downloaded and checked against its
    sha256, or the local CSV (at `local_path`, default the block's path, as the workflow resolved it)."""
    if data.source == "local":
        facts = read_local_facts(local_path or data.path, data.sha256)
    else:
        frames = []
        for wheel_spec in data.wheels:
            label = f"{wheel_spec.package}=={wheel_spec.version}"
            with tempfile.TemporaryDirectory(prefix="gna-facts-") as tmp:
                wheel = download_wheel(wheel_spec.package, wheel_spec.version, Path(tmp))
                verify_sha256(wheel, wheel_spec.sha256, f"{label} ({wheel.name})")
                frames.append(read_wheel_facts(wheel, wheel_spec.reader, label))
        facts = facts_frame([tuple(r) for frame in frames for r in frame.iter_rows()])
    write_parquet(facts, out_path)
    log.info(
        "wrote %d facts (%s) to %s",
        len(facts),
        ", ".join(f"{r}: {n}" for r, n in facts.group_by("relation").len().sort("relation").iter_rows()),
        out_path,
    )
    return facts


@dataclass(frozen=True)
class FetchFacts(RuleSettings):
    """Rule fetch_facts: where the facts come from (tasks.facts.data)."""

    data: FactsData = FactsData()


def run_fetch_facts(inputs: Files, outputs: Files, settings: FetchFacts) -> pl.DataFrame:
    """Rule fetch_facts: the facts of settings.data (read from the inputs' `local`, the local CSV
    as the workflow resolved it, where the source is local; no inputs otherwise) written to the
    outputs' `facts` (fetch_facts)."""
    return fetch_facts(settings.data, outputs.facts, local_path=inputs.get("local"))


@dataclass(frozen=True)
class ChoiceForm:
    """How a multiple-choice facts item is asked: answered with the option's `answer` (letter |
    text), after `shots` solved examples (draw `draw` of them), options listed with `marker` (dot:
    "A. Paris", paren: "(A) Paris"), through the model's chat template (`chat`, shots as earlier
    turns) with the reply opened by "The answer is" (`prefix`), and the question's options rotated
    by `rotation` places (the circular check asks each item under all four)."""

    answer: str = "text"
    shots: int = 1
    marker: str = "dot"
    chat: bool = False
    prefix: bool = False
    draw: int = 0
    rotation: int = 0

    def __post_init__(self):
        if self.answer not in CHOICE_ANSWERS:
            raise ValueError(f"tasks.facts.choice.answer: {self.answer!r}; allowed: {', '.join(CHOICE_ANSWERS)}")
        if self.marker not in MARKERS:
            raise ValueError(f"tasks.facts.choice.marker: {self.marker!r}; allowed: {', '.join(MARKERS)}")
        if self.prefix and not self.chat:
            raise ValueError("tasks.facts: prefix (the reply opened by 'The answer is') needs chat: true")
        if not 0 <= self.rotation < len(LETTERS) or self.shots < 0 or self.draw < 0:
            raise ValueError(f"a choice form needs shots >= 0, draw >= 0 and rotation 0..3: {self}")

    @classmethod
    def from_config(cls, block: dict) -> ChoiceForm:
        """The form of a `tasks.facts.choice` or `tasks.facts.compare` entry."""
        return cls(**{k: block[k] for k in ("answer", "shots", "marker", "chat", "prefix") if k in block})

    @property
    def label(self) -> str:
        """e.g. 'letter, 3 shots, (A), chat + prefix'."""
        parts = [
            self.answer,
            f"{self.shots} shot{'s' if self.shots != 1 else ''}",
            MARKERS[self.marker].format(letter="A", option="").strip(),
        ]
        if self.chat:
            parts.append("chat + prefix" if self.prefix else "chat")
        return ", ".join(parts)


@dataclass(frozen=True)
class FactSelection:
    """Which facts a facts task asks (config section tasks.facts): `n` facts split evenly over
    `relations` (RELATIONS), drawn with `seed`; `dev_n` other facts make the development split
    (tasks.facts.dev.n; split_items)."""

    relations: tuple[str, ...] = tuple(RELATIONS)
    n: int = 240
    seed: int = 1234
    dev_n: int = 0


def select_facts(
    facts: pl.DataFrame, relations: list[str], n: int, seed: int, exclude: frozenset = frozenset()
) -> list[dict]:
    """n facts, split evenly over `relations` (a relation with too few gives what it has), each with
    four options (its object and three other objects of the relation, seeded per fact so a fact's
    item does not depend on n), in a seeded order that mixes relations (evenly spaced subsets of
    the items then hold every relation). Never a subject with two answers, nor an `exclude`d
    (relation, subject)."""
    unknown = sorted(set(relations) - set(RELATIONS))
    if unknown:
        raise ValueError(f"tasks.facts.relations: unknown relations {unknown}; allowed: {', '.join(RELATIONS)}")
    absent = sorted(set(relations) - set(facts["relation"].unique()))
    if absent:
        raise ValueError(f"tasks.facts.relations: the facts hold no {absent} facts")
    items = []
    for i, relation in enumerate(relations):
        objects = sorted(set(facts.filter(pl.col("relation") == relation)["object"]))
        if len(objects) < len(LETTERS):
            raise ValueError(
                f"tasks.facts: relation {relation!r} has {len(objects)} distinct answers; "
                f"four options need at least {len(LETTERS)}"
            )
        rows = [r for r in single_answer(facts, relation) if (relation, r["subject"]) not in exclude]
        want = n // len(relations) + (1 if i < n % len(relations) else 0)
        chosen = random.Random(f"facts-{seed}-{relation}").sample(rows, min(want, len(rows)))
        for row in chosen:
            rng = random.Random(f"facts-{seed}-{relation}-{row['subject']}")
            options = rng.sample([o for o in objects if o != row["object"]], len(LETTERS) - 1) + [row["object"]]
            rng.shuffle(options)
            items.append({**row, "options": options, "target": options.index(row["object"])})
    random.Random(f"facts-order-{seed}").shuffle(items)
    return items


def split_items(facts: pl.DataFrame, relations: list[str], n: int, seed: int, split: str = "eval", dev_n: int = 0):
    """(the items of `split`, the facts left for its solved examples): the evaluation split is
    select_facts(n, seed), its examples drawn from every other fact; the development split is
    `dev_n` other facts (seed + 1), its examples drawn from facts in neither split. The evaluation
    split and its examples do not depend on the development split, so editing it rebuilds no task."""
    if split not in SPLITS:
        raise ValueError(f"unknown facts split {split!r}; allowed: {', '.join(SPLITS)}")
    items = select_facts(facts, relations, n, seed)
    taken = frozenset((it["relation"], it["subject"]) for it in items)
    if split == "dev":
        items = select_facts(facts, relations, dev_n, seed + 1, exclude=taken)
        taken |= {(it["relation"], it["subject"]) for it in items}
    pool = {r: [row for row in single_answer(facts, r) if (r, row["subject"]) not in taken] for r in relations}
    return items, pool


def solved_examples(rng: random.Random, options: list[str], pool: list[dict], answers: list[str], shots: int):
    """Up to `shots` (fact, its four options) solved examples for a question listing `options`,
    drawn so that no option string is more frequent in the context than another: where the
    relation has enough answers every example lists four strings found nowhere else in the
    prompt; otherwise (few answers: continents) every example lists exactly the question's four
    options, its own answer drawn uniformly among them (so it says nothing of the question's)."""
    out, used = [], set(options)
    if len(answers) >= len(LETTERS) * (shots + 1):
        for _ in range(shots):
            candidates = [row for row in pool if row["object"] not in used]
            if not candidates:
                break
            shot = rng.choice(candidates)
            wrong = rng.sample([a for a in answers if a not in used and a != shot["object"]], len(LETTERS) - 1)
            shown = wrong + [shot["object"]]
            rng.shuffle(shown)
            used |= set(shown)
            out.append((shot, shown))
        return out
    asked = set()
    for _ in range(shots):
        by_answer = {o: [r for r in pool if r["object"] == o and r["subject"] not in asked] for o in options}
        open_answers = [o for o in options if by_answer[o]]
        if not open_answers:
            break
        shot = rng.choice(by_answer[rng.choice(open_answers)])
        asked.add(shot["subject"])
        out.append((shot, rng.sample(options, len(options))))
    return out


def _option_lines(options: list[str], marker: str) -> str:
    return "\n".join(MARKERS[marker].format(letter=letter, option=o) for letter, o in zip(LETTERS, options))


def _choice_block(relation: str, subject: str, options: list[str], marker: str = "dot") -> str:
    return (
        f"Question: {RELATIONS[relation].question.format(subject=subject)}\n{_option_lines(options, marker)}\nAnswer:"
    )


def choice_prompt(relation: str, subject: str, options: list[str], examples: list, form: ChoiceForm, chat=None) -> str:
    """The context of one multiple-choice item: its solved `examples` [(fact, options)] then the
    question, as plain text or through `chat` (messages → the model's chat template with the
    assistant's turn opened), the reply opened by ANSWER_PREFIX where `form.prefix`."""

    def solved(fact, shown):
        return LETTERS[shown.index(fact["object"])] if form.answer == "letter" else fact["object"]

    if not form.chat:
        shots = "".join(
            f"{_choice_block(relation, fact['subject'], shown, form.marker)} {solved(fact, shown)}\n\n"
            for fact, shown in examples
        )
        return shots + _choice_block(relation, subject, options, form.marker)
    if chat is None:
        raise ValueError("a chat form needs the model's chat template (chat=)")
    ask = "the letter of the correct option" if form.answer == "letter" else "the correct option"

    def question(s, shown):
        return (
            f"{RELATIONS[relation].question.format(subject=s)}\n{_option_lines(shown, form.marker)}\nAnswer with {ask}."
        )

    messages = []
    for fact, shown in examples:
        reply = solved(fact, shown)
        messages += [
            {"role": "user", "content": question(fact["subject"], shown)},
            {"role": "assistant", "content": f"{ANSWER_PREFIX} {reply}." if form.prefix else reply},
        ]
    messages.append({"role": "user", "content": question(subject, options)})
    return chat(messages) + (ANSWER_PREFIX if form.prefix else "")


def build_facts(
    facts: pl.DataFrame,
    selection: FactSelection,
    fmt: str,
    form: ChoiceForm = ChoiceForm(),
    *,
    split: str = "eval",
    chat=None,
) -> pl.DataFrame:
    """The facts task in format `fmt` (cloze | choice) over the items of `split` (split_items of
    `selection`); the choice form asked as `form` says, its solved examples of the same relation
    drawn from the facts outside both splits (solved_examples). `chat`: messages → prompt text,
    for chat forms. Group: the relation."""
    if fmt not in FACT_FORMATS:
        raise ValueError(f"unknown facts format {fmt!r}; allowed: {', '.join(FACT_FORMATS)}")
    relations, seed = list(selection.relations), selection.seed
    items, pool = split_items(facts, relations, selection.n, seed, split, selection.dev_n)
    answers = {r: sorted(set(facts.filter(pl.col("relation") == r)["object"])) for r in relations}
    rows = []
    for item_id, it in enumerate(items):
        relation = it["relation"]
        options, target = it["options"], it["target"]
        if fmt == "cloze":
            context = RELATIONS[relation].cloze.format(subject=it["subject"])
            choices, shown = [f" {o}" for o in options], []
        else:
            turn = len(LETTERS) - form.rotation
            options, target = options[turn:] + options[:turn], (target + form.rotation) % len(LETTERS)
            rng = random.Random(f"facts-shots-{seed}-{split}-{form.draw}-{relation}-{it['subject']}")
            examples = solved_examples(rng, options, pool[relation], answers[relation], form.shots)
            context = choice_prompt(relation, it["subject"], options, examples, form, chat)
            space = "" if form.chat and not form.prefix else " "  # the reply starts a turn: no space
            choices = [f"{space}{c}" for c in (LETTERS if form.answer == "letter" else options)]
            shown = [fact["object"] for fact, _ in examples]
        rows.append(
            {
                "task": f"facts_{fmt}",
                "item_id": item_id,
                "group": relation,
                "context": context,
                "choices": choices,
                "target": target,
                "relation": relation,
                "subject": it["subject"],
                "copyable": copyable(it["subject"], it["object"]),
                "solved_answers": shown,
                "format": "cloze" if fmt == "cloze" else f"choice ({form.answer})",
            }
        )
    return pl.DataFrame(rows, schema_overrides={"solved_answers": pl.List(pl.String)})


@dataclass(frozen=True)
class FactsTask(RuleSettings):
    """Rule facts_task: the format `fmt` (wildcard facts_fmt: cloze | choice), the facts it asks
    (tasks.facts keys relations, n, seed) and the multiple-choice form (tasks.facts.choice)."""

    fmt: str
    selection: FactSelection = FactSelection()
    choice: ChoiceForm = ChoiceForm()


def run_facts_task(inputs: Files, outputs: Files, settings: FactsTask) -> pl.DataFrame:
    """Rule facts_task: builds the facts task in format `settings.fmt` from the facts table of
    the inputs' `facts` and writes it to the outputs' `table`."""
    fmt, out_path = settings.fmt, outputs.table
    table = build_facts(read_parquet(inputs.facts), settings.selection, fmt, settings.choice)
    write_parquet(table, out_path)
    log.info(
        "wrote %d %s items (%s) to %s",
        len(table),
        fmt,
        ", ".join(f"{g}: {c}" for g, c in table.group_by("group").len().sort("group").iter_rows()),
        out_path,
    )
    return table


def repeats_solved_answer(pred: int, choices: list[str], solved_answers: list[str] | None) -> bool:
    """Whether the option a model chose (index `pred` of an item's `choices`) is the answer of one
    of its prompt's solved examples: what a form that copies its examples answers."""
    return choices[pred].strip() in (solved_answers or [])


def cloze_margin(cloze_items: pl.DataFrame) -> pl.Series:
    """Per item of a cloze per-item frame: log-prob of the target minus the best other option's."""
    return pl.Series(
        "margin",
        [
            lp[t] - max(v for j, v in enumerate(lp) if j != t)
            for lp, t in zip(cloze_items["logprobs"].to_list(), cloze_items["target"].to_list())
        ],
        dtype=pl.Float64,
    )


def known_items(choice: pl.DataFrame, cloze_items: pl.DataFrame, margin: float) -> pl.DataFrame:
    """The multiple-choice table `choice` with `group` set to 'known' where the item's cloze twin
    (same item_id in `cloze_items`, a model's per-item cloze scores) is right by at least `margin`
    nats over the best wrong option, else 'unknown'. Refuses items without a cloze score."""
    scored = cloze_items.select("item_id", cloze_margin(cloze_items))
    joined = choice.join(scored, on="item_id", how="left", maintain_order="left")
    if joined["margin"].null_count():
        missing = joined.filter(pl.col("margin").is_null())["item_id"].to_list()
        raise ValueError(f"{len(missing)} multiple-choice items have no cloze score (first item_id {missing[0]})")
    return joined.with_columns(
        pl.when(pl.col("margin") >= margin).then(pl.lit(KNOWN)).otherwise(pl.lit(UNKNOWN)).alias("group"),
        pl.col("margin").alias("cloze_margin"),
    ).drop("margin")


@dataclass(frozen=True)
class FactsKnown(RuleSettings):
    """Rule facts_known: the cloze margin in nats an item's answer needs to be known
    (tasks.facts.known_margin)."""

    margin: float = 1.0


def run_facts_known(inputs: Files, outputs: Files, settings: FactsKnown) -> pl.DataFrame:
    """Rule facts_known: known_items of the multiple-choice table of the inputs' `choice` by the
    per-item cloze scores of the inputs' `cloze` (a baseline's `facts_cloze.items.parquet`),
    written to the outputs' `table`."""
    margin, out_path = settings.margin, outputs.table
    table = known_items(read_parquet(inputs.choice), read_parquet(inputs.cloze), margin)
    write_parquet(table, out_path)
    known = int((table["group"] == KNOWN).sum())
    log.info("%d of %d items known (cloze margin >= %.2f nats); wrote %s", known, len(table), margin, out_path)
    return table
