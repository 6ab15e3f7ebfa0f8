import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "vllm: needs the embedded vLLM engine (slow start)")
    config.addinivalue_line("markers", "ros: needs ROS 2 (rclpy and the built interfaces)")
