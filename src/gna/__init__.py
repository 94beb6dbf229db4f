"""gna: the Gather-and-Aggregate study as a reproducible pipeline library.

All logic lives here; Snakemake rules and workflow scripts only move paths and parameters.
"""

__version__ = "0.1.0"
