"""Model sources (PyPI files, the hub, local folders, tiny random models) and prepared model folders."""
