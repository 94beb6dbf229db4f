"""Infrastructure every phase uses: config validation, atomic I/O, provenance and code fingerprints, process set-up."""
