"""Settings the rules pass to the library: built once from the validated config, checked where they
are made, each naming the config key it comes from."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from gna.engine.precision import COMPUTE_DTYPES
from gna.models.prepare import DTYPES


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
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype: {self.dtype!r} is not one of {', '.join(DTYPES)}")
        if self.compute_dtype not in COMPUTE_DTYPES:
            raise ValueError(f"eval.compute_dtype: {self.compute_dtype!r} is not one of {', '.join(COMPUTE_DTYPES)}")

    @classmethod
    def from_config(cls, config: dict) -> Evaluation:
        return cls(config["eval"]["batch_size"], config["dtype"], config["eval"]["compute_dtype"])

    def as_params(self) -> dict:
        """A plain dict for a rule's params (Snakemake compares it between runs; Evaluation(**it) in the script)."""
        return asdict(self)


# the checks of the teacher's scores that keep a student off a task (hybrid.skip_where_teacher_*)
TEACHER_CHECKS = ("degenerate", "at_chance")


@dataclass(frozen=True)
class StudentScoring:
    """How the hybrid phase scores the teacher and its students (config section hybrid):

    items             items per task (hybrid.eval_items; hybrid.answer_rows_items for the answer-row
                      masking); None: all, the teacher's baseline items
    degeneracy_items  items per task rescored with another item's context (hybrid.degeneracy_items)
    dict_size         the one KV dictionary size of the budget curve, the recipe ablations and the
                      state-size sweep's students, and the pool of KV retrieval's degeneracy check
                      (hybrid.dict_size)
    teacher_checks    the checks of the teacher's scores that keep a student off a task
                      (hybrid.skip_where_teacher_degenerate / _at_chance)
    evaluation        how models are loaded and scored (Evaluation)

    A rule passes only the fields its function reads (as_params), so an edit of another reruns
    nothing of it."""

    items: int | None = None
    degeneracy_items: int | None = None
    dict_size: int | None = None
    teacher_checks: tuple[str, ...] = TEACHER_CHECKS
    evaluation: Evaluation = Evaluation()

    def __post_init__(self):
        for key, value in (("eval_items", self.items), ("degeneracy_items", self.degeneracy_items)):
            if value is not None and (not isinstance(value, int) or value < 0):
                raise ValueError(f"hybrid.{key}: {value!r} is not a non-negative integer or null")
        if self.dict_size is not None and (not isinstance(self.dict_size, int) or self.dict_size < 1):
            raise ValueError(f"hybrid.dict_size: {self.dict_size!r} is not a positive integer")
        unknown = sorted(set(self.teacher_checks) - set(TEACHER_CHECKS))
        if unknown:
            raise ValueError(f"hybrid.skip_where_teacher_*: unknown teacher checks {unknown}; known: {TEACHER_CHECKS}")
        object.__setattr__(self, "teacher_checks", tuple(self.teacher_checks))
        if isinstance(self.evaluation, dict):
            object.__setattr__(self, "evaluation", Evaluation(**self.evaluation))

    @classmethod
    def from_config(cls, config: dict, items_key: str = "eval_items") -> StudentScoring:
        hybrid = config["hybrid"]
        return cls(
            items=hybrid[items_key],
            degeneracy_items=hybrid["degeneracy_items"],
            dict_size=hybrid["dict_size"],
            teacher_checks=tuple(c for c in TEACHER_CHECKS if hybrid[f"skip_where_teacher_{c}"]),
            evaluation=Evaluation.from_config(config),
        )

    def as_params(self, *fields: str) -> dict:
        """The `fields` (default all) as a plain dict for a rule's params; StudentScoring(**it) in
        the script gives the others their defaults."""
        unknown = sorted(set(fields) - set(self.__dataclass_fields__))
        if unknown:
            raise ValueError(f"StudentScoring has no fields {unknown}")
        plain = {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(self).items()}
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
