"""The smoke config's values as the report rule passes them, for test_registry.py and test_report.py
(imported by name: pytest puts this folder on sys.path when it imports their files)."""

# the smoke config's models, students and variants (config/smoke.yaml), as rules/report.smk passes them
SMOKE_VALUES = {
    "model": ["tiny-llama"],
    "case_model": [],  # the smoke config runs no case study
    "pruned_model": ["tiny-llama"],
    "attribution_model": ["tiny-llama"],
    "hybrid_model": ["tiny-llama"],
    "gna_model": ["tiny-llama", "tiny-llama-hybrid-k0-n8", "tiny-llama-hybrid-k2-n8"],
    "scored_variant": ["teacher", "k0-n8", "k2-n8", "k0-n4"],
    "student_variant": ["k0-n8", "k2-n8", "k0-n4"],
    "answer_row_variant": ["k2-n8"],
    "budget_variant": ["k0-n8", "k2-n8"],
    "ablation": ["no_first_token", "small_corpus"],
    "state_size": [4, 8],
    "paired_mmlu_format": ["letter", "cloze"],
    "facts_format": ["cloze", "choice"],
}
