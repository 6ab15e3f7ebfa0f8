import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "vllm: needs the embedded vLLM engine (slow start)")
    config.addinivalue_line("markers", "ros: needs ROS 2 (rclpy and the built interfaces)")


@pytest.fixture(scope="session")
def tello_client_ports() -> tuple[int, int]:
    """djitellopy binds its client ports once per process and never releases them: pick them once."""
    from djitellopy import Tello

    from timely_llm.executors.tello import use_client_ports
    from timely_llm.executors.tello_sim import free_udp_port

    use_client_ports(free_udp_port(), free_udp_port())
    return Tello.CONTROL_UDP_PORT, Tello.STATE_UDP_PORT
