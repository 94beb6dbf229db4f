# Acquire each model once and convert it to a local HF folder (safetensors + tokenizer).


rule fetch_model_file:
    output:
        gguf="data/downloads/models/{model}.gguf",
    params:
        settings=lambda wildcards: {"spec": get_model_spec(wildcards)},
        code=code_of("fetch_model_file"),
    log:
        "data/logs/fetch_model_file/{model}.log",
    resources:
        mem_mb=1000,
        runtime=30,
    script:
        "../workflow_scripts/fetch_model_file.py"


# its input `source`: the fetched GGUF or the local path resolved against the workflow folder (an
# input, so that it reruns when the file changes); hf and tiny-random sources have none
rule prepare_model:
    input:
        source=get_model_raw,
    output:
        model=directory("data/models/{model}"),
    params:
        settings=lambda wildcards: {"model": wildcards.model, "source": get_model_spec(wildcards), "dtype": config["dtype"]},
        code=code_of("prepare_model"),
    log:
        "data/logs/prepare_model/{model}.log",
    benchmark:
        "data/benchmarks/prepare_model/{model}.tsv"
    threads: 2
    resources:
        mem_mb=job_mem_mb("prepare_model"),
        runtime=120,
    script:
        "../workflow_scripts/prepare_model.py"
