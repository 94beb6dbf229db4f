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
        gna_roles=expand("data/results/gna/{model}/roles.parquet", model=GNA_MODELS),
        gna_maps=expand("data/results/gna/{model}/maps.parquet", model=GNA_MODELS),
        gna_masking=expand("data/results/gna/{model}/masking.parquet", model=GNA_MODELS),
        hybrid_scores=expand("data/results/hybrid/{model}/{variant}.parquet", model=MODELS,
                             variant=["teacher"] + hybrid_variants()) if HYBRID["enabled"] else [],
        hybrid_swap=expand("data/results/hybrid/{model}/swap.parquet", model=MODELS)
        if HYBRID["enabled"] and HYBRID["swap"] else [],
        hybrid_answer_rows=expand("data/results/hybrid/{model}/answer-rows-{variant}.parquet", model=MODELS,
                                  variant=answer_row_variants()) if HYBRID["enabled"] else [],
        hybrid_memory=expand("data/results/hybrid/{model}/memory.parquet", model=MODELS) if HYBRID["enabled"] else [],
        hybrid_align=expand("data/distill/{model}/align-n{n}.parquet", model=MODELS,
                            n=sorted({HYBRID["state_size"], *HYBRID["state_sizes"]})) if HYBRID["enabled"] else [],
        hybrid_kd=expand("data/distill/{model}/kd-{variant}.parquet", model=MODELS, variant=hybrid_variants())
        if HYBRID["enabled"] else [],
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
        gna_maps_mmlu=_figure("gna_maps_mmlu", "Gather-and-Aggregate"),
        hybrid_heads=_figure("hybrid_heads", "SSM and hybrid students"),
        hybrid_training=_figure("hybrid_training", "SSM and hybrid students"),
    params:
        report=config["report"],
        config=config,
        benchmark_dir="data/benchmarks",
        workflow_dir=workflow.basedir,
        code=code_version("report", "report_prune", "report_heads", "report_gna", "report_hybrid", "htmlkit", "provenance", "io"),
    log:
        "data/logs/report.log",
    script:
        "../workflow_scripts/report.py"
