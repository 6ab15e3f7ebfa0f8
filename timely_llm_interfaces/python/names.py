"""The names of the node's interface, and what makes an agent id: one source for the node, its clients and the
SROS2 policies (``security_policy``); no ROS import, so a policy can be written anywhere."""

from __future__ import annotations

import re

MAX_ID_CHARS = 256
"""Longest agent or request id."""
_NAME_TOKEN = re.compile(r"[A-Za-z][A-Za-z0-9_]*")
REQUEST_PLAN = "request_plan"
TASK_REQUESTS = "task_requests"
STATUS = "status"
SEGMENT_DONE = "segment_done"
CANCEL = "cancel"
SEGMENTS = "segments"
PLAN_RESULT = "plan_result"


def agent_id_error(agent_id: str) -> str | None:
    """Why ``agent_id`` cannot name a robot's topics (``<agent_id>/segment_done``...: one ROS name token), or None."""
    if not agent_id.strip():
        return "empty agent id"
    if len(agent_id) > MAX_ID_CHARS:
        return f"agent id longer than {MAX_ID_CHARS} characters"
    if not _NAME_TOKEN.fullmatch(agent_id) or "__" in agent_id:
        return (f"agent id {agent_id!r} is not a ROS name token (a letter, then letters, digits and single "
                "underscores), so it cannot name its topics")
    return None


def report_topic(agent_id: str) -> str:
    """Where the robot ``agent_id`` reports its executed segments (relative to the node's namespace)."""
    return f"{agent_id}/{SEGMENT_DONE}"


def cancel_topic(agent_id: str) -> str:
    """Where the robot ``agent_id`` cancels its topic requests."""
    return f"{agent_id}/{CANCEL}"


def agent_topics(agent_id: str) -> tuple[str, str]:
    """The relative names of a robot's segments and plan_result topics (the node publishes, the robot reads)."""
    return f"{agent_id}/{SEGMENTS}", f"{agent_id}/{PLAN_RESULT}"
