"""Evaluation sets as tidy tables (KV-retrieval, MMLU letter/cloze) and the lm-eval bridge."""
