# Acquire each model once and convert it to a local HF folder (safetensors + tokenizer).


rule fetch_model_file:
    output:
        "data/downloads/models/{model}.gguf",
    params:
        spec=get_model_spec,
        code=code_of("fetch_model_file"),
    log:
        "data/logs/fetch_model_file/{model}.log",
    resources:
        mem_mb=1000,
        runtime=30,
    script:
        "../workflow_scripts/fetch_model_file.py"


rule prepare_model:
    input:
        get_model_raw,
    output:
        directory("data/models/{model}"),
    params:
        spec=get_model_spec,
        # only a fetched GGUF is read as a file; a local source is an input so that it reruns
        raw_file=lambda wildcards, input: input[0] if get_model_spec(wildcards)["source"] == "pypi-file" else None,
        dtype=config["dtype"],
        code=code_of("prepare_model"),
    log:
        "data/logs/prepare_model/{model}.log",
    benchmark:
        "data/benchmarks/prepare_model/{model}.tsv"
    threads: 2
    resources:
        mem_mb=4000,
        runtime=120,
    script:
        "../workflow_scripts/prepare_model.py"
