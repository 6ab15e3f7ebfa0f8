import socket

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "vllm: needs the embedded vLLM engine (slow start)")
    config.addinivalue_line("markers", "ros: needs ROS 2 (rclpy and the built interfaces)")


def free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="session")
def tello_client_ports() -> tuple[int, int]:
    """djitellopy binds its client ports once per process and never releases them: pick them once."""
    from djitellopy import Tello

    from timely_llm.executors.tello import use_client_ports

    use_client_ports(free_udp_port(), free_udp_port())
    return Tello.CONTROL_UDP_PORT, Tello.STATE_UDP_PORT
