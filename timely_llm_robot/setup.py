from setuptools import find_packages, setup

PACKAGE = "timely_llm_robot"

setup(
    name=PACKAGE,
    version="0.1.0",
    description="The robot side of timely_llm: the robot client library and executors",
    license="Apache-2.0",
    packages=find_packages(include=[PACKAGE, f"{PACKAGE}.*"]),
    data_files=[("share/ament_index/resource_index/packages", [f"resource/{PACKAGE}"]),
                (f"share/{PACKAGE}", ["package.xml"])],
    python_requires=">=3.10",
    install_requires=[],  # rclpy and timely_llm_interfaces come from the ROS installation
    extras_require={"tello": ["djitellopy"], "bt": ["py_trees>=2.2"]},  # bt: timely_llm_robot.bt
    zip_safe=True,
)
