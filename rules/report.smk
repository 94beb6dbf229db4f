# The report: tables and figures regenerated from the Parquet results, with provenance.


rule report:
    input:
        baseline="data/results/baseline.parquet",
        models=expand("data/models/{model}", model=MODELS),
        kv_task="data/tasks/kv_retrieval.parquet",
    output:
        html="data/report/index.html",
        kv_figure=report(
            "data/report/figures/baseline_kv.png",
            caption="captions/baseline_kv.rst",
            category="Baseline",
        ),
        mmlu_figure=report(
            "data/report/figures/baseline_mmlu.png",
            caption="captions/baseline_mmlu.rst",
            category="Baseline",
        ),
    params:
        report=config["report"],
        config=config,
        benchmark_dir="data/benchmarks",
        workflow_dir=workflow.basedir,
        code=code_version("report", "provenance", "io"),
    log:
        "data/logs/report.log",
    script:
        "../workflow_scripts/report.py"
