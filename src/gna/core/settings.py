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
