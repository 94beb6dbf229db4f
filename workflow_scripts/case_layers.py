"""Rule case_layers: each of the minimal model's deepest layers removed alone, and its critical layers."""

from gna.core.runtime import run_rule
from gna.phases.case_study import CaseLayers, run_case_layers

run_rule(snakemake, run_case_layers, CaseLayers)
