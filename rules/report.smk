# The report: tables and figures regenerated from the Parquet results, with provenance. Its
# inputs, figures and captions come from the registry the HTML report renders (gna.report.registry).
import json

from gna.report.registry import FIGURES, HTML, report_inputs


def get_report_inputs():
    """Every report section's inputs, expanded over this config's models and students."""
    hybrid = HYBRID["enabled"]
    values = {
        "model": MODELS,
        "case_model": config["case_study"]["models"],
        "pruned_model": PRUNED_MODELS,
        "attribution_model": ATTRIBUTION_MODELS,
        "hybrid_model": TEACHERS,
        "gna_model": GNA_MODELS,
        "scored_variant": [TEACHER_VARIANT] + hybrid_variants(),
        "student_variant": hybrid_variants(),
        "answer_row_variant": answer_row_variants(HYBRID),
        "budget_variant": HYBRID["budget_curve"]["variants"],
        "ablation": HYBRID["ablation"]["remove"],
        "state_size": sorted({HYBRID["state_size"], *HYBRID["state_sizes"]}),
        "facts_format": config["tasks"]["facts"]["formats"],
        "paired_mmlu_format": ["letter", "cloze"] if {"letter", "cloze"} <= set(config["tasks"]["mmlu"]["formats"]) else [],
    }
    return report_inputs(values, {"hybrid": hybrid, "hybrid_swap": hybrid and HYBRID["swap"],
                                  "facts_choice": "choice" in config["tasks"]["facts"]["formats"]})


rule report:
    input:
        **get_report_inputs(),
    output:
        html=HTML,
        **{figure.name: report(figure.path, caption=os.path.join(workflow.basedir, figure.caption_file),
                               category=figure.category) for figure in FIGURES},
    params:
        # the whole validated config as JSON: the report shows and hashes all of it
        settings={
            "options": config["report"],
            "config_json": json.dumps(config, sort_keys=True),
            "workflow_dir": within_workdir(workflow.basedir),  # so a moved project reruns nothing
        },
        code=code_of("report"),
    log:
        "data/logs/report.log",
    script:
        "../workflow_scripts/report.py"
