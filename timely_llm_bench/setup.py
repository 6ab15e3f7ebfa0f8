from setuptools import find_packages, setup

PACKAGE = "timely_llm_bench"

setup(
    name=PACKAGE,
    version="0.1.0",
    description="timely_llm's benchmarks, workloads, fleets and demo",
    license="Apache-2.0",
    packages=find_packages(include=[PACKAGE, f"{PACKAGE}.*"]),
    package_data={PACKAGE: ["workloads/*.yaml", "evaluation/*.yaml"]},
    data_files=[("share/ament_index/resource_index/packages", [f"resource/{PACKAGE}"]),
                (f"share/{PACKAGE}", ["package.xml"])],
    python_requires=">=3.10",
    install_requires=["numpy", "pyyaml", "matplotlib"],  # timely_llm and timely_llm_robot: the packages beside it
    zip_safe=False,  # workload files are read beside the modules
    entry_points={"timely_llm.commands": ["benchmarks = timely_llm_bench.cli:register"]},
)
