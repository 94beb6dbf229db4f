"""Concatenate per-(model, task) result tables into one tidy table."""
from gna.io import read_parquet, write_parquet
from gna.runtime import setup

import polars as pl

log = setup(snakemake.log[0])
frames = [read_parquet(path) for path in snakemake.input]
table = pl.concat(frames, how="diagonal_relaxed") if frames else pl.DataFrame()
write_parquet(table, snakemake.output[0])
log.info("collected %d rows from %d files", len(table), len(frames))
