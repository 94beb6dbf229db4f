# The report: tables and figures regenerated from the Parquet results, with provenance.


def _figure(name, category):
    return report(f"data/report/figures/{name}.png", caption=f"captions/{name}.rst", category=category)


rule report:
    input:
        baseline="data/results/baseline.parquet",
        models=expand("data/models/{model}", model=MODELS),
        kv_task="data/tasks/kv_retrieval.parquet",
        prune_gradual=expand("data/results/prune/{model}/gradual.parquet", model=MODELS),
        prune_individual=expand("data/results/prune/{model}/individual.parquet", model=MODELS),
        prune_minimal=expand("data/results/prune/{model}/minimal_model.json", model=MODELS),
        heads_sweep=expand("data/results/heads/{model}/sweep.parquet", model=MODELS),
        heads_ranking=expand("data/results/heads/{model}/ranking.parquet", model=MODELS),
        heads_topk=expand("data/results/heads/{model}/topk.parquet", model=MODELS),
        heads_kept=expand("data/results/heads/{model}/kept.parquet", model=MODELS),
        heads_dictsize=expand("data/results/heads/{model}/dictsize.parquet", model=MODELS),
        heads_attribution=expand("data/results/heads/{model}/attribution.parquet", model=MODELS),
        gna_roles=expand("data/results/gna/{model}/roles.parquet", model=MODELS),
        gna_maps=expand("data/results/gna/{model}/maps.parquet", model=MODELS),
        gna_masking=expand("data/results/gna/{model}/masking.parquet", model=MODELS),
    output:
        html="data/report/index.html",
        kv=_figure("baseline_kv", "Baseline"),
        mmlu=_figure("baseline_mmlu", "Baseline"),
        gradual=_figure("prune_gradual", "Layer pruning"),
        individual=_figure("prune_individual", "Layer pruning"),
        heads_heatmap=_figure("heads_heatmap", "Heads"),
        heads_topk=_figure("heads_topk", "Heads"),
        heads_dictsize=_figure("heads_dictsize", "Heads"),
        heads_attribution=_figure("heads_attribution", "Heads"),
        gna_maps=_figure("gna_maps", "Gather-and-Aggregate"),
    params:
        report=config["report"],
        config=config,
        benchmark_dir="data/benchmarks",
        workflow_dir=workflow.basedir,
        code=code_version("report", "report_prune", "report_heads", "report_gna", "htmlkit", "provenance", "io"),
    log:
        "data/logs/report.log",
    script:
        "../workflow_scripts/report.py"
