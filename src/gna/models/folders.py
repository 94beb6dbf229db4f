"""File names inside a prepared model folder that more than one module must know (kept free of
torch and of other gna modules, so that knowing a name pulls in no code)."""

# a folder holding this JSON file is a distilled hybrid / SSM student (gna.students.spec)
STUDENT_SPEC_FILE = "gna_hybrid.json"
