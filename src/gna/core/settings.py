"""Settings the rules pass to the library: built once from the validated config, checked where they
are made, each naming the config key it comes from."""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import asdict, dataclass

from gna.core.chance import ChancePolicy

# The dtype names a config may give (dtype, eval.compute_dtype). torch's dtypes for them are mapped
# where models load (gna.models.prepare.DTYPES, gna.engine.precision.COMPUTE_DTYPES), so that these
# settings, which the Snakefile reads while it is parsed, import no torch.
DTYPE_NAMES = ("float32", "bfloat16", "float16")
COMPUTE_DTYPE_NAMES = ("float32", "bfloat16")


def typed(kind, value, key: str = "settings"):
    """`value` (what a rule passes: dicts, lists, scalars) as the type `kind`: a dict becomes the
    settings dataclass `kind` (its fields typed in turn; an unknown key raises, naming it), a list
    a tuple where `kind` is one; anything else is kept as it is. `key` names the value in errors."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if value is None:
        return None
    if origin in (typing.Union, types.UnionType):
        for option in args:
            if option is not type(None) and (dataclasses.is_dataclass(option) or typing.get_origin(option)):
                return typed(option, value, key)
        return value
    if dataclasses.is_dataclass(kind) and isinstance(kind, type):
        if isinstance(value, kind):
            return value
        if not isinstance(value, dict):
            raise ValueError(f"{key}: {value!r} is not a mapping of {kind.__name__}'s keys")
        hints = typing.get_type_hints(kind)
        names = {f.name for f in dataclasses.fields(kind) if f.init}
        unknown = sorted(set(value) - names)
        if unknown:
            raise ValueError(f"{key}: unknown keys {unknown} ({kind.__name__} takes {', '.join(sorted(names))})")
        return kind(**{k: typed(hints[k], v, f"{key}.{k}") for k, v in value.items()})
    if origin is tuple and isinstance(value, (list, tuple)):
        inner = args[0] if args and (len(args) == 1 or args[-1] is Ellipsis) else None
        return tuple(v if inner is None else typed(inner, v, key) for v in value)
    return value


def plain(value):
    """A settings object as plain data (dicts, lists, scalars) for a rule's params, which
    Snakemake compares between runs; typed() builds it back."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value) if f.init}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value


class RuleSettings:
    """Base of the settings a rule hands its run_<rule> function (run_<rule>(inputs, outputs,
    settings)): a frozen dataclass of typed fields, one per value the rule reads (config blocks
    as their own settings classes, the wildcards a job is run for). The rule passes it as plain
    data (params: settings=...); `of` builds it in the job."""

    @classmethod
    def of(cls, values: dict):
        return typed(cls, values, cls.__name__)

    def as_params(self) -> dict:
        return plain(self)


@dataclass(frozen=True)
class Evaluation:
    """How a model is loaded and scored: `dtype` of its weights (config key dtype), the dtype of its
    linear layers' matmuls (eval.compute_dtype; gna.engine.precision) and the items per forward
    (eval.batch_size)."""

    batch_size: int = 8
    dtype: str = "float32"
    compute_dtype: str = "float32"

    def __post_init__(self):
        if not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise ValueError(f"eval.batch_size: {self.batch_size!r} is not a positive integer")
        if self.dtype not in DTYPE_NAMES:
            raise ValueError(f"dtype: {self.dtype!r} is not one of {', '.join(DTYPE_NAMES)}")
        if self.compute_dtype not in COMPUTE_DTYPE_NAMES:
            raise ValueError(
                f"eval.compute_dtype: {self.compute_dtype!r} is not one of {', '.join(COMPUTE_DTYPE_NAMES)}"
            )

    @classmethod
    def from_config(cls, config: dict) -> Evaluation:
        return cls(config["eval"]["batch_size"], config["dtype"], config["eval"]["compute_dtype"])

    def as_params(self) -> dict:
        """A plain dict for a rule's params (Snakemake compares it between runs; Evaluation(**it) in the script)."""
        return asdict(self)


def model_heads(config: dict, model: str) -> dict:
    """The heads section for `model`: its models.<name>.overrides.heads over the config's heads section."""
    return {**config["heads"], **config["models"][model].get("overrides", {}).get("heads", {})}


def model_prune(config: dict, model: str) -> dict:
    """The prune section for `model`: its models.<name>.overrides.prune over the config's prune section
    (e.g. a model that answers the letter format cut on MMLU letter, the others on KV retrieval)."""
    return {**config["prune"], **config["models"][model].get("overrides", {}).get("prune", {})}


def model_facts(config: dict, model: str) -> dict:
    """The tasks.facts section for `model`'s format comparison: its models.<name>.overrides.facts
    (compare, draws) over the config's."""
    return {**config["tasks"]["facts"], **config["models"][model].get("overrides", {}).get("facts", {})}


@dataclass(frozen=True)
class TopK:
    """The remove-top-k table (config section heads): `ks` the numbers of top-ranked heads removed
    together (heads.top_k); the random-k controls: `random_draws` seeded draws per k (heads.random_draws,
    seed heads.seed) scoring `control_tasks` (heads.control_tasks), the tasks other than the sweep's at
    the k of `control_k` only (heads.control_k; None: every k) with the first `control_draws` draws
    (heads.control_draws; None: random_draws); the tasks outside `curve_tasks` (heads.curve_tasks; None: every
    task) only at k = 0 and the k of control_k, top and random."""

    ks: tuple[int, ...] = (0, 1, 2, 5, 10, 20)
    random_draws: int = 3
    control_tasks: tuple[str, ...] = ("kv_retrieval",)
    seed: int = 4321
    control_k: tuple[int, ...] | None = None
    control_draws: int | None = None
    curve_tasks: tuple[str, ...] | None = None

    def __post_init__(self):
        for key, value in (("top_k", self.ks), ("control_k", self.control_k)):
            if value is not None and (not value or any(not isinstance(k, int) or k < 0 for k in value)):
                raise ValueError(f"heads.{key}: {value!r} is not a list of non-negative integers")
        for key, value in (("random_draws", self.random_draws), ("control_draws", self.control_draws)):
            if value is not None and (not isinstance(value, int) or value < 0):
                raise ValueError(f"heads.{key}: {value!r} is not a non-negative integer")
        if self.curve_tasks is not None and self.control_k is None:
            raise ValueError(
                "heads.curve_tasks: the tasks off the curve are scored at the k of heads.control_k, which is null"
            )
        for name in ("ks", "control_tasks", "control_k", "curve_tasks"):
            value = getattr(self, name)
            object.__setattr__(self, name, None if value is None else tuple(value))

    @classmethod
    def from_heads(cls, heads: dict) -> TopK:
        """From a heads section (a model's: gna.workflow.plan.model_heads)."""
        return cls(
            ks=heads["top_k"],
            random_draws=heads["random_draws"],
            control_tasks=heads["control_tasks"],
            seed=heads["seed"],
            control_k=heads["control_k"],
            control_draws=heads["control_draws"],
            curve_tasks=heads["curve_tasks"],
        )

    def as_params(self) -> dict:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(self).items()}


@dataclass(frozen=True)
class StudentScoring:
    """How the hybrid phase scores the teacher and its students (config section hybrid):

    items             items per task (hybrid.eval_items; hybrid.answer_rows_items for the answer-row
                      masking); None: all, the teacher's baseline items
    degeneracy_items  items per task rescored with another item's context (hybrid.degeneracy_items)
    dict_size         the one KV dictionary size of the budget curve, the recipe ablations and the
                      state-size sweep's students, and the pool of KV retrieval's degeneracy check
                      (hybrid.dict_size)
    chance            the chance policy (config block chance): a student is not scored where
                      its teacher is degenerate or at chance (ChancePolicy.teacher_reasons), nor
                      its answer rows masked where it is at chance itself
    evaluation        how models are loaded and scored (Evaluation)

    A rule passes only the fields its function reads (as_params), so an edit of another reruns
    nothing of it."""

    items: int | None = None
    degeneracy_items: int | None = None
    dict_size: int | None = None
    chance: ChancePolicy = ChancePolicy()
    evaluation: Evaluation = Evaluation()

    def __post_init__(self):
        for key, value in (("eval_items", self.items), ("degeneracy_items", self.degeneracy_items)):
            if value is not None and (not isinstance(value, int) or value < 0):
                raise ValueError(f"hybrid.{key}: {value!r} is not a non-negative integer or null")
        if self.dict_size is not None and (not isinstance(self.dict_size, int) or self.dict_size < 1):
            raise ValueError(f"hybrid.dict_size: {self.dict_size!r} is not a positive integer")
        if isinstance(self.chance, dict):
            object.__setattr__(self, "chance", ChancePolicy(**self.chance))
        if isinstance(self.evaluation, dict):
            object.__setattr__(self, "evaluation", Evaluation(**self.evaluation))

    @classmethod
    def from_config(cls, config: dict, items_key: str = "eval_items") -> StudentScoring:
        hybrid = config["hybrid"]
        return cls(
            items=hybrid[items_key],
            degeneracy_items=hybrid["degeneracy_items"],
            dict_size=hybrid["dict_size"],
            chance=ChancePolicy.from_config(config),
            evaluation=Evaluation.from_config(config),
        )

    def as_params(self, *fields: str) -> dict:
        """The `fields` (default all) as a plain dict for a rule's params; StudentScoring(**it) in
        the script gives the others their defaults."""
        unknown = sorted(set(fields) - set(self.__dataclass_fields__))
        if unknown:
            raise ValueError(f"StudentScoring has no fields {unknown}")
        plain = {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(self).items()}
        plain["chance"] = {"skip": self.chance.skip}
        return {k: plain[k] for k in (fields or plain)}


class Files:
    """A rule's named files, its input or its output (Snakemake's snakemake.input and
    snakemake.output: Files.of(snakemake.input)): each by its role's name as an attribute, a
    list of paths where the rule names several; a role the call lacks raises, naming it."""

    def __init__(self, **paths):
        self._paths = {k: (list(v) if isinstance(v, (list, tuple)) else v) for k, v in paths.items()}

    @classmethod
    def of(cls, named) -> Files:
        return cls(**{k: (list(v) if not isinstance(v, str) else v) for k, v in named.items()})

    def __getattr__(self, role: str):
        paths = self.__dict__.get("_paths", {})
        if role not in paths:
            raise AttributeError(f"no {role!r} file here (files: {', '.join(paths) or 'none'})")
        return paths[role]

    def get(self, role: str, default=None):
        """The file(s) of `role`, or `default` where the call has none (or an empty list)."""
        value = self._paths.get(role)
        return default if value in (None, [], "") else value

    def __repr__(self) -> str:
        return f"Files({', '.join(f'{k}={v!r}' for k, v in self._paths.items())})"
