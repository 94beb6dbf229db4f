"""The HTML report: a registry of sections, their tables, figures and captions."""
