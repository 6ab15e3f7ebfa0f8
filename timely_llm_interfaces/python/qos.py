"""QoS of the node's action and topics: one definition, used by the node and by its clients.

ROS 2's defaults keep the last 10 requests of a service and the last 10 messages of a
feedback topic per reader; a burst of hundreds of goals overflows them and the rest are
dropped without an answer. Every queue on the request path is reliable and deep enough
for :data:`BURST_DEPTH` goals in flight at once.
"""

from __future__ import annotations

from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy

BURST_DEPTH = 2048
"""Goal, cancel and result requests/responses, feedback and SegmentDone reports a reader holds before it
drops the oldest: more than the 1,000 goals in flight the node is sized for."""

DEEP_RELIABLE = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=BURST_DEPTH,
                           reliability=ReliabilityPolicy.RELIABLE, durability=DurabilityPolicy.VOLATILE)
"""The request path: the action's three services, its feedback topic, ``task_requests``, and each robot's
``<agent_id>/segment_done`` and ``<agent_id>/cancel``."""

TASK_REQUESTS_QOS = DEEP_RELIABLE
"""``task_requests``: reliable and volatile, a request is for the node running now."""

AGENT_QOS = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=100, reliability=ReliabilityPolicy.RELIABLE,
                       durability=DurabilityPolicy.TRANSIENT_LOCAL)
"""``<agent_id>/segments`` and ``<agent_id>/plan_result``, on the node and on the robot (``topic_requests``): a
late reader gets the last 100 messages, a robot's few plans in flight."""

SERVER_STATUS_QOS = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=10, reliability=ReliabilityPolicy.RELIABLE)
"""``status`` (ServerStatus): periodic, only the latest matters."""


def action_server_qos() -> dict[str, QoSProfile]:
    """Keyword arguments of rclpy's ``ActionServer`` for the node's ``request_plan``."""
    return {"goal_service_qos_profile": DEEP_RELIABLE, "result_service_qos_profile": DEEP_RELIABLE,
            "cancel_service_qos_profile": DEEP_RELIABLE, "feedback_pub_qos_profile": DEEP_RELIABLE}


def action_client_qos() -> dict[str, QoSProfile]:
    """Keyword arguments of rclpy's ``ActionClient`` for ``request_plan``: the same queues on the client side."""
    return {"goal_service_qos_profile": DEEP_RELIABLE, "result_service_qos_profile": DEEP_RELIABLE,
            "cancel_service_qos_profile": DEEP_RELIABLE, "feedback_sub_qos_profile": DEEP_RELIABLE}
