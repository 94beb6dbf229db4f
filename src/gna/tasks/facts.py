"""The knowledge task family: simple world facts, asked in cloze and in multiple-choice form.

Facts are (relation, subject, object) triples read from data files that PyPI wheels ship
(countryinfo: capitals, continents, demonyms; periodictable: chemical symbols), each wheel
checksum-pinned, or from a local CSV with those three columns. From them:

* `facts_cloze` — knowledge only: "The capital of France is" → " Paris" among four options,
  scored by log-likelihood as MMLU cloze is;
* `facts_choice` — knowledge plus the in-context step: the same question with the same four
  options listed as "A. … D." lines, answered with the letter (`answer: letter`, MMLU's format)
  or with the option's own text (`answer: text`);
* the known items: per model, the multiple-choice items whose cloze twin (same fact, same
  options) the model gets right by at least `known_margin` nats over the best wrong option,
  so the multiple-choice score measures the in-context step on knowledge the model has.

Item i of both formats is the same fact with the same options in the same order.
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
from gna.models.sources import SourceError, download_wheel, resolve_local, verify_sha256

log = logging.getLogger("gna.tasks.facts")

FACT_FORMATS = ("cloze", "choice")
CHOICE_ANSWERS = ("letter", "text")
LETTERS = ("A", "B", "C", "D")
KNOWN, UNKNOWN = "known", "unknown"
FACT_COLUMNS = ("relation", "subject", "object", "source")


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
    return (
        pl.DataFrame(rows, schema=list(FACT_COLUMNS), orient="row")
        .unique(subset=["relation", "subject"], keep="first", maintain_order=True)
        .sort("relation", "subject")
    )


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


def fetch_facts(data: dict, out_path: str | Path, local_path: str | Path | None = None) -> pl.DataFrame:
    """The facts of the `tasks.facts.data` config block as one Parquet table (relation, subject,
    object, source) at `out_path`: each pinned wheel downloaded and checked against its sha256,
    or the local CSV (at `local_path`, default the block's path, as the workflow resolved it)."""
    if data["source"] == "local":
        facts = read_local_facts(local_path or data["path"], data.get("sha256"))
    else:
        frames = []
        for wheel_spec in data["wheels"]:
            label = f"{wheel_spec['package']}=={wheel_spec['version']}"
            with tempfile.TemporaryDirectory(prefix="gna-facts-") as tmp:
                wheel = download_wheel(wheel_spec["package"], wheel_spec["version"], Path(tmp))
                verify_sha256(wheel, wheel_spec["sha256"], f"{label} ({wheel.name})")
                frames.append(read_wheel_facts(wheel, wheel_spec["reader"], label))
        facts = facts_frame([tuple(r) for frame in frames for r in frame.iter_rows()])
    write_parquet(facts, out_path)
    log.info(
        "wrote %d facts (%s) to %s",
        len(facts),
        ", ".join(f"{r}: {n}" for r, n in facts.group_by("relation").len().sort("relation").iter_rows()),
        out_path,
    )
    return facts


def select_facts(facts: pl.DataFrame, relations: list[str], n: int, seed: int) -> list[dict]:
    """n facts, split evenly over `relations` (a relation with too few gives what it has), each with
    four options (its object and three other objects of the relation, seeded per fact so a fact's
    item does not depend on n), in a seeded order that mixes relations (evenly spaced subsets of
    the items then hold every relation)."""
    unknown = sorted(set(relations) - set(RELATIONS))
    if unknown:
        raise ValueError(f"tasks.facts.relations: unknown relations {unknown}; allowed: {', '.join(RELATIONS)}")
    absent = sorted(set(relations) - set(facts["relation"].unique()))
    if absent:
        raise ValueError(f"tasks.facts.relations: the facts hold no {absent} facts")
    items = []
    for i, relation in enumerate(relations):
        rows = facts.filter(pl.col("relation") == relation).sort("subject").rows(named=True)
        objects = sorted({r["object"] for r in rows})
        if len(objects) < len(LETTERS):
            raise ValueError(
                f"tasks.facts: relation {relation!r} has {len(objects)} distinct answers; "
                f"four options need at least {len(LETTERS)}"
            )
        want = n // len(relations) + (1 if i < n % len(relations) else 0)
        chosen = random.Random(f"facts-{seed}-{relation}").sample(rows, min(want, len(rows)))
        for row in chosen:
            rng = random.Random(f"facts-{seed}-{relation}-{row['subject']}")
            options = rng.sample([o for o in objects if o != row["object"]], len(LETTERS) - 1) + [row["object"]]
            rng.shuffle(options)
            items.append({**row, "options": options, "target": options.index(row["object"])})
    random.Random(f"facts-order-{seed}").shuffle(items)
    return items


def _choice_block(relation: str, subject: str, options: list[str]) -> str:
    lines = "\n".join(f"{letter}. {option}" for letter, option in zip(LETTERS, options))
    return f"Question: {RELATIONS[relation].question.format(subject=subject)}\n{lines}\nAnswer:"


def build_facts(
    facts: pl.DataFrame, relations: list[str], n: int, seed: int, fmt: str, answer: str = "text", shots: int = 0
) -> pl.DataFrame:
    """The facts task in format `fmt` (cloze | choice) over select_facts' items; the choice form
    answers with the letter or the option's text (`answer`), after `shots` solved examples of the
    same relation drawn from facts outside the evaluation set. Group: the relation."""
    if fmt not in FACT_FORMATS:
        raise ValueError(f"unknown facts format {fmt!r}; allowed: {', '.join(FACT_FORMATS)}")
    if answer not in CHOICE_ANSWERS:
        raise ValueError(f"tasks.facts.choice.answer: {answer!r}; allowed: {', '.join(CHOICE_ANSWERS)}")
    items = select_facts(facts, relations, n, seed)
    chosen = {(it["relation"], it["subject"]) for it in items}
    pool = {
        r: [
            row
            for row in facts.filter(pl.col("relation") == r).sort("subject").rows(named=True)
            if (r, row["subject"]) not in chosen
        ]
        for r in relations
    }
    answers = {r: sorted(set(facts.filter(pl.col("relation") == r)["object"])) for r in relations}
    rows = []
    for item_id, it in enumerate(items):
        relation = it["relation"]
        if fmt == "cloze":
            context = RELATIONS[relation].cloze.format(subject=it["subject"])
            choices = [f" {o}" for o in it["options"]]
        else:
            rng = random.Random(f"facts-shots-{seed}-{relation}-{it['subject']}")
            shot_text = ""
            for shot in rng.sample(pool[relation], min(shots, len(pool[relation]))):
                # the example's wrong options never include the asked question's answer
                wrong = [o for o in answers[relation] if o not in (shot["object"], it["object"])]
                options = rng.sample(wrong, min(len(wrong), len(LETTERS) - 1)) + [shot["object"]]
                rng.shuffle(options)
                solved = LETTERS[options.index(shot["object"])] if answer == "letter" else shot["object"]
                shot_text += f"{_choice_block(relation, shot['subject'], options)} {solved}\n\n"
            context = shot_text + _choice_block(relation, it["subject"], it["options"])
            choices = [f" {letter}" for letter in LETTERS] if answer == "letter" else [f" {o}" for o in it["options"]]
        rows.append(
            {
                "task": f"facts_{fmt}",
                "item_id": item_id,
                "group": relation,
                "context": context,
                "choices": choices,
                "target": it["target"],
                "relation": relation,
                "subject": it["subject"],
                "format": "cloze" if fmt == "cloze" else f"choice ({answer})",
            }
        )
    return pl.DataFrame(rows)


def write_facts_task(facts_path: str | Path, facts_cfg: dict, fmt: str, out_path: str | Path) -> pl.DataFrame:
    """Build the facts task in format `fmt` from the facts table `facts_path` and the `tasks.facts`
    config keys relations, n, seed and choice (answer, shots); write it to `out_path` as Parquet."""
    table = build_facts(
        read_parquet(facts_path),
        facts_cfg["relations"],
        facts_cfg["n"],
        facts_cfg["seed"],
        fmt,
        facts_cfg["choice"]["answer"],
        facts_cfg["choice"]["shots"],
    )
    write_parquet(table, out_path)
    log.info(
        "wrote %d %s items (%s) to %s",
        len(table),
        fmt,
        ", ".join(f"{g}: {c}" for g, c in table.group_by("group").len().sort("group").iter_rows()),
        out_path,
    )
    return table


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


def write_known_task(
    choice_path: str | Path, cloze_items_path: str | Path, margin: float, out_path: str | Path
) -> pl.DataFrame:
    """known_items of the multiple-choice table `choice_path` by the per-item cloze scores
    `cloze_items_path` (a baseline's `facts_cloze.items.parquet`), written to `out_path`."""
    table = known_items(read_parquet(choice_path), read_parquet(cloze_items_path), margin)
    write_parquet(table, out_path)
    known = int((table["group"] == KNOWN).sum())
    log.info("%d of %d items known (cloze margin >= %.2f nats); wrote %s", known, len(table), margin, out_path)
    return table
