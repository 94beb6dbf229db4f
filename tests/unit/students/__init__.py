"""Tests of gna.students; a package so that its conftest.py and rules.py import as
unit.students.conftest and unit.students.rules."""
