import importlib.util
import os
import random
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from installed import missing_imports
from spun_nodes import spun_node

SELECT_INSTALLED = os.environ.get("TIMELY_LLM_TEST_SELECT_INSTALLED") == "1"
"""Set by ``colcon test`` (CMakeLists.txt): leave out the modules whose imports are not installed, saying which."""
_LEFT_OUT: dict[str, frozenset[str]] = {}

_ROS_DOMAINS = random.SystemRandom()
# Fast DDS binds UDP ports 7400 + 250 * domain + 0..249 (the RTPS port mapping). Above domain 100 these reach Linux's
# ephemeral ports (32768 up), where a port drawn for djitellopy or a Tello simulator can be a participant's, and its
# discovery packets then reach the drone's socket (CI once failed a takeoff on "response decode error" that way).
_ROS_DOMAIN_RANGE = (1, 100)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "vllm: needs the embedded vLLM engine (slow start)")
    config.addinivalue_line("markers", "ros: needs ROS 2 (rclpy and the built interfaces)")
    config.addinivalue_line("markers", "remote: needs vllm serve (the vllm_serve fixture starts one, slow)")
    config.addinivalue_line("markers", "needs_vllm: imports vLLM while it runs (no engine start): skipped, saying so, "
                                       "where colcon test runs without vLLM installed")
    config.addinivalue_line("markers", "no_vllm: a node test that needs neither vLLM nor torch: scripts/test.sh runs "
                                       "these on Python 3.10 too")


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    if not SELECT_INSTALLED or collection_path.suffix != ".py" or not collection_path.name.startswith("test_"):
        return None
    missing = missing_imports(collection_path)
    if missing:
        _LEFT_OUT[collection_path.name] = missing
        return True
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under ``colcon test`` without vLLM, the tests that import it while they run are skipped with the reason."""
    if not SELECT_INSTALLED or importlib.util.find_spec("vllm") is not None:
        return
    skip = pytest.mark.skip(reason="needs vllm, not installed here")
    for item in items:
        if item.get_closest_marker("needs_vllm"):
            item.add_marker(skip)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for module, missing in sorted(_LEFT_OUT.items()):
        terminalreporter.write_line(f"left out {module}: needs {', '.join(sorted(missing))}, not installed here")


@pytest.fixture(scope="session")
def tello_client_ports() -> tuple[int, int]:
    """djitellopy binds its client ports once per process and never releases them: pick them once."""
    from djitellopy import Tello

    from timely_llm_bench.robots.tello_sim import free_udp_port
    from timely_llm_robot.executors.tello import use_client_ports

    use_client_ports(free_udp_port(), free_udp_port())
    return Tello.CONTROL_UDP_PORT, Tello.STATE_UDP_PORT


# ----- ROS 2 (rclpy + Fast DDS on loopback): every test gets a DDS domain of its own -----

@pytest.fixture
def ros_domain(monkeypatch: pytest.MonkeyPatch) -> int:
    """A DDS domain drawn at random: test runs of other processes on this host draw theirs alike, so two tests
    rarely meet (counting from the pid made two runs started together meet test after test)."""
    monkeypatch.setenv("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
    return _ROS_DOMAINS.randint(*_ROS_DOMAIN_RANGE)


@pytest.fixture
def session(ros_domain: int) -> Iterator:
    """(context, executor) of an rclpy session spinning in a thread."""
    from timely_llm_bench.robots.fleet import ros_session

    with ros_session(ros_domain) as ctx_exec:
        yield ctx_exec


@pytest.fixture
def link(session: tuple) -> Iterator:
    """A PlanLink (action client + SegmentDone publisher) on a node of its own."""
    from timely_llm_robot.client import PlanLink

    with spun_node(session, "test_robots") as node:
        yield PlanLink(node)


@pytest.fixture
def robots(link: object) -> Iterator[Callable]:
    """Makes RobotClients on ``link`` executing SimulatedSkills at 0.2x their time unless given a runner."""
    from timely_llm.plan.robot_file import load_skill_models
    from timely_llm_bench.robots.simulated import SimulatedSkills
    from timely_llm_robot.client import RobotClient

    skills = load_skill_models()
    made: list[RobotClient] = []

    def make(agent: str, robot: str = "tello", runner: Callable | None = None, report: bool = True) -> RobotClient:
        made.append(RobotClient(link, agent, robot, runner or SimulatedSkills(skills[robot], time_scale=0.2), report))
        return made[-1]

    yield make
    for robot in made:
        robot.close()


@pytest.fixture
def topic_link(session: tuple) -> Iterator:
    """A TopicPlanLink (task_requests publisher, per-robot topics) on a node of its own."""
    from timely_llm_robot.topic_client import TopicPlanLink

    with spun_node(session, "test_topic_robots") as node:
        yield TopicPlanLink(node)


@pytest.fixture
def topic_robots(topic_link: object) -> Iterator[Callable]:
    """Makes TopicRobotClients on ``topic_link`` executing SimulatedSkills at 0.2x their time."""
    from timely_llm.plan.robot_file import load_skill_models
    from timely_llm_bench.robots.simulated import SimulatedSkills
    from timely_llm_robot.topic_client import TopicRobotClient

    skills = load_skill_models()
    made: list[TopicRobotClient] = []

    def make(agent: str, robot: str = "tello", report: bool = True) -> TopicRobotClient:
        made.append(TopicRobotClient(topic_link, agent, robot, SimulatedSkills(skills[robot], time_scale=0.2), report))
        return made[-1]

    yield make
    for robot in made:
        robot.close()


# ----- vllm serve for the remote engine: one server shared by every test of the session -----

@pytest.fixture(scope="session")
def vllm_serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    """A ``vllm serve`` (remote_servers.start_serve) for the whole session; its key is in API_KEY_ENV.
    ``TIMELY_LLM_TEST_SERVE_URL`` names one already serving instead (started by start_serve's settings)."""
    import os
    import types

    from remote_servers import API_KEY, API_KEY_ENV, start_serve

    os.environ[API_KEY_ENV] = API_KEY
    if os.environ.get("TIMELY_LLM_TEST_SERVE_URL"):
        yield types.SimpleNamespace(url=os.environ["TIMELY_LLM_TEST_SERVE_URL"])
        return
    server = start_serve(tmp_path_factory.mktemp("vllm-serve"), "shared")
    yield server
    server.close()


@pytest.fixture
def server_log(monkeypatch: pytest.MonkeyPatch) -> Callable[[], str]:
    """What the server node has logged so far, recorded where rclpy hands each line to rcutils.

    Not read from captured stderr: each read (capfd) truncates the capture file after reading it,
    losing any line the node writes in between.
    """
    from rclpy.impl.implementation_singleton import rclpy_implementation

    lines: list[str] = []
    lock = threading.Lock()
    emit = rclpy_implementation.rclpy_logging_rcutils_log

    def recording_emit(severity: int, name: str, message: str, *caller: object) -> None:
        if name == "timely_llm_server":
            with lock:
                lines.append(message)
        emit(severity, name, message, *caller)

    monkeypatch.setattr(rclpy_implementation, "rclpy_logging_rcutils_log", recording_emit)

    def logged() -> str:
        with lock:
            return "\n".join(lines)

    return logged
