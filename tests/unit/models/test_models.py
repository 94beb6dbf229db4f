import json
import os
import subprocess
import sys

import pytest
import torch

from gna.core.settings import Files
from gna.engine.device import device_of
from gna.models.folders import read_provenance
from gna.models.prepare import (
    ModelSource,
    PrepareModel,
    load_model,
    load_source,
    prepare_model,
    run_prepare_model,
)
from gna.models.sources import ChecksumError, SourceError

TINY = {"source": "tiny-random", "arch": "llama", "layers": 2, "hidden": 32, "heads": 4, "kv_heads": 2, "seed": 5}


def _logits(model, tok, text="key:42\nLookup:"):
    """The model's logits for `text`, run on the model's device, on the CPU."""
    ids = tok(text, return_tensors="pt").input_ids.to(device_of(model))
    with torch.inference_mode():
        return model(ids).logits.cpu()


def test_tiny_random_is_seeded():
    a, tok = load_source(TINY, None)
    b, _ = load_source(TINY, None)
    c, _ = load_source(dict(TINY, seed=6), None)
    assert torch.equal(_logits(a, tok), _logits(b, tok))
    assert not torch.equal(_logits(a, tok), _logits(c, tok))


def test_prepare_roundtrip_is_exact(tmp_path):
    model, tok = load_source(TINY, None)
    info = prepare_model("tiny", TINY, tmp_path / "tiny")
    assert info["n_layers"] == 2 and info["architecture"] == "LlamaForCausalLM"
    assert read_provenance(tmp_path / "tiny")["spec"] == TINY
    loaded, loaded_tok = load_model(tmp_path / "tiny")
    assert loaded_tok("key:42")["input_ids"] == tok("key:42")["input_ids"]
    model.to(device_of(loaded))  # the source is built on the CPU: bit for bit needs the loaded one's device
    assert torch.equal(_logits(model, tok), _logits(loaded, loaded_tok))
    assert not list(tmp_path.glob(".*tmp*")), "temporary folder left behind"


def test_preparing_twice_gives_the_same_bytes(tmp_path):
    """No time or machine in a prepared folder: DVC hashes it the same for the same source."""
    prepare_model("tiny", TINY, tmp_path / "a")
    prepare_model("tiny", TINY, tmp_path / "b")
    files = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert files == sorted(p.name for p in (tmp_path / "b").iterdir()) and "gna_source.json" in files
    for name in files:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name


def test_the_rule_prepares_what_its_validated_spec_names_and_records_it_as_before(tmp_path):
    """Rule prepare_model's settings as the workflow passes them (the validated entry, every key
    of its source with the schema's defaults): the same folder as prepare_model of that dict,
    whose provenance records the same spec, keys sorted like the validated config's."""
    spec = dict(sorted(dict(TINY, window=8, intermediate=64, vocab=None).items()))  # as validated: keys sorted
    settings = PrepareModel.of({"model": "tiny", "source": spec, "dtype": "float32"})
    run_prepare_model(Files(source=[]), Files(model=str(tmp_path / "rule")), settings)
    prepare_model("tiny", spec, tmp_path / "direct")
    assert list(read_provenance(tmp_path / "rule")["spec"]) == sorted(spec)
    for name in sorted(p.name for p in (tmp_path / "direct").iterdir()):
        assert (tmp_path / "rule" / name).read_bytes() == (tmp_path / "direct" / name).read_bytes(), name
    pinned = {"source": "pypi-file", "package": "p", "version": "1", "member": "m.gguf", "sha256": "0" * 64}
    assert ModelSource(**pinned).spec() == pinned
    parts = {"source": "pypi-file", "sha256": "0" * 64, "parts": [dict(pinned, source=None), dict(pinned, source=None)]}
    parts["parts"] = [{k: v for k, v in part.items() if k != "source"} for part in parts["parts"]]
    assert PrepareModel.of({"model": "m", "source": parts}).source.spec() == parts
    assert ModelSource(source="hf", id="a/b").spec() == {"id": "a/b", "revision": None, "source": "hf"}


def test_local_source_and_missing_folder(tmp_path):
    prepare_model("tiny", TINY, tmp_path / "a")
    prepare_model("copy", {"source": "local", "path": str(tmp_path / "a")}, tmp_path / "b")
    m1, t1 = load_model(tmp_path / "a")
    m2, t2 = load_model(tmp_path / "b")
    assert torch.equal(_logits(m1, t1), _logits(m2, t2))
    with pytest.raises(SourceError, match="local path does not exist: .*nowhere"):
        prepare_model("x", {"source": "local", "path": str(tmp_path / "nowhere")}, tmp_path / "c")
    assert not (tmp_path / "c").exists()


def test_a_source_file_is_checked_against_the_configured_checksum_at_every_conversion(tmp_path):
    """A GGUF fetched (or restored) earlier is checked again when the config's sha256 changed:
    the conversion fails naming the file and writes nothing."""
    gguf = tmp_path / "downloads/m.gguf"
    gguf.parent.mkdir()
    gguf.write_bytes(b"GGUF, or so it claims")
    pinned = {"source": "pypi-file", "package": "p", "version": "1", "member": "m.gguf", "sha256": "0" * 64}
    for spec, path in ((pinned, gguf), ({"source": "local", "path": str(gguf), "sha256": "f" * 64}, None)):
        with pytest.raises(ChecksumError, match="checksum mismatch for .*m.gguf"):
            prepare_model("m", spec, tmp_path / "out", source_path=path)
        assert not (tmp_path / "out").exists()
    with pytest.raises(ValueError, match="'pypi-file' model source needs the path of its file"):
        load_source(dict(pinned, sha256=None))


def test_unknown_source_is_named():
    with pytest.raises(ValueError, match="unknown model source 'ftp'"):
        load_source({"source": "ftp"}, None)


@pytest.mark.slow
def test_hf_source_resolves_a_hub_id_through_the_hf_cache(tmp_path):
    """The `hf` path is the real from_pretrained(hub id) code; here the hub cache is pre-filled
    (as on a cluster node without network) and HF_HUB_OFFLINE=1 forbids any download."""
    prepare_model("tiny", TINY, tmp_path / "src")
    snapshot = tmp_path / "hub" / "models--gna-test--tiny-llama" / "snapshots" / ("a" * 40)
    snapshot.mkdir(parents=True)
    for f in (tmp_path / "src").iterdir():
        (snapshot / f.name).symlink_to(f)
    (tmp_path / "hub" / "models--gna-test--tiny-llama" / "refs").mkdir()
    (tmp_path / "hub" / "models--gna-test--tiny-llama" / "refs" / "main").write_text("a" * 40)
    code = (
        "from gna.models.prepare import prepare_model; import json, sys;"
        "info = prepare_model('hub-tiny', {'source': 'hf', 'id': 'gna-test/tiny-llama'}, sys.argv[1]);"
        "print(json.dumps(info['spec']))"
    )
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(tmp_path / "hub"), HF_HOME=str(tmp_path / "home"))
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path / "out")], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1])["id"] == "gna-test/tiny-llama"
    m1, t1 = load_model(tmp_path / "src")
    m2, t2 = load_model(tmp_path / "out")
    assert torch.equal(_logits(m1, t1), _logits(m2, t2))
    # an id that is not in the cache fails with the hub's own error, naming the id
    proc = subprocess.run(
        [sys.executable, "-c", code.replace("gna-test/tiny-llama", "gna-test/absent"), str(tmp_path / "out2")],
        env=env,
        capture_output=True,
        text=True,
    )
    assert proc.returncode != 0 and "gna-test/absent" in proc.stderr
    assert not (tmp_path / "out2").exists()


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma3"])
def test_strip_quantization_takes_the_weights_over_without_a_copy(tmp_path, arch):
    """The plain model a GGUF-loaded one is saved through holds the same tensors (one model in
    memory, not two: a 1.5B model's float32 weights are 7 GB), computes the same logits, has no
    tensor left on the meta device, and saves to a folder that loads back to the same logits."""
    from gna.models.prepare import _strip_quantization

    model, tok = load_source({**TINY, "arch": arch})
    plain = _strip_quantization(model)
    assert [p.data_ptr() for p in plain.parameters()] == [p.data_ptr() for p in model.parameters()]
    assert not [name for name, t in [*plain.named_parameters(), *plain.named_buffers()] if t.is_meta]
    assert torch.equal(_logits(plain, tok), _logits(model, tok))
    plain.save_pretrained(tmp_path, safe_serialization=True)
    tok.save_pretrained(tmp_path)
    # loaded back on the source's device (the CPU): bit for bit holds on one device only
    assert torch.equal(_logits(load_model(tmp_path, device=device_of(model).type)[0], tok), _logits(model, tok))
