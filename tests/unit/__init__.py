"""The library's unit tests. A package only so that tests/unit/students (a package too) can have its
own conftest.py beside tests/conftest.py; the other folders' test files are imported by name."""
