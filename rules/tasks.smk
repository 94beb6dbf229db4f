# Evaluation sets as Parquet: seeded KV-retrieval and MMLU in letter and cloze format.


rule fetch_mmlu:
    output:
        "data/downloads/mmlu.jsonl",
    params:
        spec=config["tasks"]["mmlu"]["data"],
        code=code_of("fetch_mmlu"),
    log:
        "data/logs/fetch_mmlu.log",
    resources:
        mem_mb=1000,
        runtime=30,
    script:
        "../workflow_scripts/fetch_mmlu.py"


rule kv_task:
    output:
        "data/tasks/kv_retrieval.parquet",
    params:
        kv=config["tasks"]["kv_retrieval"],
        code=code_of("kv_task"),
    log:
        "data/logs/kv_task.log",
    script:
        "../workflow_scripts/kv_task.py"


rule mmlu_task:
    input:
        get_mmlu_file,
    output:
        "data/tasks/mmlu_{fmt}.parquet",
    params:
        # the formats list is left out on purpose: adding a format must not rebuild the others
        mmlu={k: v for k, v in config["tasks"]["mmlu"].items() if k not in ("formats", "data")},
        sha256=config["tasks"]["mmlu"]["data"].get("sha256"),
        code=code_of("mmlu_task"),
    log:
        "data/logs/mmlu_task/{fmt}.log",
    script:
        "../workflow_scripts/mmlu_task.py"
