"""File names inside a prepared model folder that more than one module must know, and what they
say (kept free of torch and of other gna modules, so that knowing a name pulls in no code)."""

import json
from pathlib import Path

# a folder holding this JSON file is a distilled hybrid / SSM student (gna.students.spec)
STUDENT_SPEC_FILE = "gna_hybrid.json"


def is_student(model_dir) -> bool:
    """Whether the model folder `model_dir` holds a distilled student (STUDENT_SPEC_FILE)."""
    return (Path(model_dir) / STUDENT_SPEC_FILE).is_file()


def read_provenance(model_dir) -> dict:
    """Where a prepared model came from (its gna_source.json; {} where it has none)."""
    path = Path(model_dir) / "gna_source.json"
    return json.loads(path.read_text()) if path.exists() else {}
