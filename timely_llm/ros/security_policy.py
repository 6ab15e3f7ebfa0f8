"""``timely-llm security-policy``: SROS2 permission policies for the node and each robot (sros2's policy format,
version 0.2.0: ``sros2/policy/schemas/policy.xsd``).

A robot may publish on its own ``<agent>/task_requests``, ``<agent>/segment_done`` and ``<agent>/cancel``,
subscribe to its own ``<agent>/segments`` and ``<agent>/plan_result``, and, unless its policy is written from a
fleet file without ``shared``, publish on the shared ``task_requests`` and call the ``request_plan`` action (where
a policy cannot check the agent id a request names). The node may subscribe to every robot's request, report and
cancel topics, publish their segments and results, and execute the action, all through wildcards
(``<ns>/*/segment_done``...), so its policy names no robot: adding a robot to the fleet needs no new permissions
for the node, only the new robot's own policy. Each also gets what any rclpy node uses (``rosout``,
``/parameter_events``, its parameter services, ``/clock``), the node its lifecycle services and its ``status``
and ``/diagnostics`` topics.

What this protects and what it does not: docs/node.md, "Security".

Names are written absolute, under the node's namespace, so a policy does not depend on where the robot's own
node sits. A profile names the node it is for: the server is ``timely_llm_server``, a robot's node is named
after its agent id (``--robot-node`` names it otherwise, ``{agent}`` standing for the id).
"""

from __future__ import annotations

from pathlib import Path
from xml.etree import ElementTree

from timely_llm_interfaces.names import (
    REQUEST_PLAN,
    STATUS,
    TASK_REQUESTS,
    agent_id_error,
    agent_topics,
    cancel_topic,
    report_topic,
)

from timely_llm.ros.fleet_file import Fleet, own_request_topic

POLICY_VERSION = "0.2.0"
SERVER_NODE = "timely_llm_server"
ENCLAVE_ROOT = "/timely_llm"
NODE_TOPICS = {"publish": ["/rosout", "/parameter_events"], "subscribe": ["/parameter_events", "/clock"]}
PARAMETER_SERVICES = ["describe_parameters", "get_parameter_types", "get_parameters", "get_type_description",
                      "list_parameters", "set_parameters", "set_parameters_atomically"]
LIFECYCLE_SERVICES = ["change_state", "get_available_states", "get_available_transitions", "get_state",
                      "get_transition_graph"]


def write_policies(agents: list[str], out_dir: Path, namespace: str = "/", robot_node: str = "{agent}",
                   shared: bool = True) -> list[Path]:
    """One policy file per robot (``<agent>.policy.xml``) and one for the node (``timely_llm_server.policy.xml``)
    in ``out_dir``; ValueError names an agent id that cannot name topics. ``shared``: robots may also use the
    shared ``task_requests`` and the action (where they can name any agent id)."""
    for agent in agents:
        error = agent_id_error(agent)
        if error:
            raise ValueError(error)
    if len(set(agents)) != len(agents):
        raise ValueError("an agent id is listed twice")
    out_dir.mkdir(parents=True, exist_ok=True)
    ns = "/" + namespace.strip("/") if namespace.strip("/") else "/"
    written = []
    for name, policy in [(agent, robot_policy(agent, ns, robot_node.format(agent=agent), shared))
                         for agent in agents] + [(SERVER_NODE, server_policy(ns))]:
        path = out_dir / f"{name}.policy.xml"
        ElementTree.indent(policy)
        path.write_bytes(ElementTree.tostring(policy, encoding="UTF-8", xml_declaration=True) + b"\n")
        written.append(path)
    return written


def fleet_agents(fleet: Fleet, agents: list[str]) -> list[str]:
    """The robots to write policies for: every id the fleet file names, and ``agents`` (ids its patterns match);
    ValueError names an agent the fleet file does not match."""
    for agent in agents:
        if fleet.entry(agent) is None:
            raise ValueError(f"agent {agent!r} is not in the fleet file {fleet.source}")
    return sorted(set(fleet.named) | set(agents))


def robot_policy(agent: str, namespace: str, node: str, shared: bool = True) -> ElementTree.Element:
    """What robot ``agent`` may publish, subscribe to and call."""
    segments, results = agent_topics(agent)
    profile = _profile(namespace, node)
    own = [own_request_topic(agent), report_topic(agent), cancel_topic(agent)]
    _topics(profile, "publish", [_absolute(namespace, n) for n in ([TASK_REQUESTS] if shared else []) + own])
    _topics(profile, "subscribe", [_absolute(namespace, n) for n in (segments, results)])
    if shared:
        _list(profile, "actions", "action", {"call": "ALLOW"}, [_absolute(namespace, REQUEST_PLAN)])
    return _policy(f"{ENCLAVE_ROOT}/{agent}", profile)


def server_policy(namespace: str) -> ElementTree.Element:
    """What the node may publish, subscribe to and serve: every robot's topics through wildcards (fnmatch's ``*``,
    which DDS Security's permissions take in topic names), so the policy names no robot."""
    every = "*"
    profile = _profile(namespace, SERVER_NODE)
    _topics(profile, "subscribe", [_absolute(namespace, n) for n in (
        TASK_REQUESTS, own_request_topic(every), report_topic(every), cancel_topic(every))])
    _topics(profile, "publish", [_absolute(namespace, STATUS), "/diagnostics", "~/transition_event"] + [
        _absolute(namespace, name) for name in agent_topics(every)])
    _list(profile, "services", "service", {"reply": "ALLOW"}, [f"~/{s}" for s in LIFECYCLE_SERVICES])
    _list(profile, "actions", "action", {"execute": "ALLOW"}, [_absolute(namespace, REQUEST_PLAN)])
    return _policy(f"{ENCLAVE_ROOT}/{SERVER_NODE}", profile)


def _profile(namespace: str, node: str) -> ElementTree.Element:
    """A profile for ``node`` with what every rclpy node uses (logging, parameters, time)."""
    profile = ElementTree.Element("profile", ns=namespace, node=node)
    for rule, names in NODE_TOPICS.items():
        _topics(profile, rule, names)
    _list(profile, "services", "service", {"reply": "ALLOW", "request": "ALLOW"},
          [f"~/{s}" for s in PARAMETER_SERVICES])
    return profile


def _policy(enclave_path: str, profile: ElementTree.Element) -> ElementTree.Element:
    """The policy document: one enclave holding ``profile``."""
    policy = ElementTree.Element("policy", version=POLICY_VERSION)
    enclave = ElementTree.SubElement(ElementTree.SubElement(policy, "enclaves"), "enclave", path=enclave_path)
    ElementTree.SubElement(enclave, "profiles").append(profile)
    return policy


def _topics(profile: ElementTree.Element, rule: str, names: list[str]) -> None:
    _list(profile, "topics", "topic", {rule: "ALLOW"}, names)


def _list(profile: ElementTree.Element, tag: str, item: str, rules: dict[str, str], names: list[str]) -> None:
    group = ElementTree.SubElement(profile, tag, rules)
    for name in names:
        ElementTree.SubElement(group, item).text = name


def _absolute(namespace: str, name: str) -> str:
    return f"{namespace.rstrip('/')}/{name}"
