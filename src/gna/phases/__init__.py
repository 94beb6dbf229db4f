"""The study's experiments on any model: baseline, layer pruning, per-head ablation, G&A roles and masking."""
