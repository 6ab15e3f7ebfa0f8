"""The node's ``status`` topic (ServerStatus, every ``status_period``) and ``/diagnostics`` (every second, with a
throttled WARN log line while urgent goals miss their deadlines)."""

from __future__ import annotations

from diagnostic_msgs.msg import DiagnosticArray
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup
from timely_llm_interfaces.qos import SERVER_STATUS_QOS

from timely_llm.engines.registry import engine_kind
from timely_llm.ros.diagnostics import Snapshot, diagnostic_array, urgent_warning
from timely_llm.ros.goal_desk import GoalDesk
from timely_llm.ros.interfaces import CategoryStatus, ServerStatus
from timely_llm.ros.ledger import Ledger
from timely_llm.ros.server_loop import ServerLoop
from timely_llm.ros.server_node import Guard, ServerNode
from timely_llm.server import Server

DIAGNOSTICS_PERIOD_S = 1.0
MISS_LOG_PERIOD_S = 10.0
"""While urgent goals miss their deadlines, the node logs so at WARN at most this often."""


class StatusReporter:
    """Publishes what the node serves with and how loaded it is; reads the Server under its lock, briefly."""

    def __init__(self, node: ServerNode, loop: ServerLoop, ledger: Ledger, desk: GoalDesk, guarded: Guard) -> None:
        self._node, self._loop, self._ledger, self._desk = node, loop, ledger, desk
        self._engine_name = ""
        self._kv_blocks = -1
        self._status_pub = node.create_lifecycle_publisher(ServerStatus, "status", SERVER_STATUS_QOS)
        reporting = MutuallyExclusiveCallbackGroup()
        self._status_timer = node.create_timer(node.param("status_period"), guarded(self._publish_status),
                                               callback_group=reporting)
        self._diagnostics_pub = node.create_publisher(DiagnosticArray, "/diagnostics", 10)
        node.create_timer(DIAGNOSTICS_PERIOD_S, guarded(self._publish_diagnostics), callback_group=reporting)

    def configured(self, server: Server, engine_name: str) -> None:
        self._engine_name = engine_name
        self._kv_blocks = server.engine.free_kv_blocks()

    def set_period(self, seconds: float) -> None:
        self._status_timer.timer_period_ns = round(seconds * 1e9)
        self._status_timer.reset()

    def _publish_status(self) -> None:
        server = self._node.server
        if server is None or not self._desk.serving:
            return
        view = server.view()  # under the server's lock, briefly: the loop holds it for a decision at most
        counts = view.counts
        totals, finished, executing = self._ledger.totals()
        self._status_pub.publish(ServerStatus(
            stamp=self._node.get_clock().now().to_msg(), queue_length=counts.queued, running=counts.running,
            suspended=counts.suspended, executing=executing, waiting=counts.blocked, finished=finished,
            policy=view.policy,
            engine=self._engine_name, categories=[CategoryStatus(name=category, mean_utility=mean, finished=count)
                                                  for category, count, mean in totals]))

    def _publish_diagnostics(self) -> None:
        snap = self.snapshot()
        self._diagnostics_pub.publish(diagnostic_array(snap, self._node.get_clock().now().to_msg()))
        if snap.urgent_misses:
            self._node.get_logger().warning(urgent_warning(snap), throttle_duration_sec=MISS_LOG_PERIOD_S)

    def snapshot(self) -> Snapshot:
        node = self._node
        state, error = node.lifecycle_state, node.configure_error
        snap = Snapshot(node=node.get_fully_qualified_name(), lifecycle=state,
                        phase=node.phase if state != "unconfigured" or error else "unconfigured",
                        failed=bool(error) and state == "unconfigured", engine=node.param("engine"),
                        model=node.param("model"), device=self._device(), policy=node.param("policy"))
        server = node.server
        if server is None:
            return snap
        with server.lock:  # one instant: the server's lock is reentrant
            view = server.view()
            snap.kv_free_blocks, snap.kv_blocks = server.engine.free_kv_blocks(), self._kv_blocks
            snap.servers = server.engine.servers()
        snap.robot_types = self._ledger.served.lines(list(server.robots))
        snap.queue, snap.running, snap.policy, snap.batch_cap = (view.counts.queued, view.counts.running, view.policy,
                                                                 view.batch_cap)
        snap.kv_reuse = view.kv_reuse
        snap.executing = self._ledger.executing()
        snap.last_step_s = self._loop.last_step_s
        snap.loop_alive = self._loop.alive()
        return snap

    def _device(self) -> str:
        if engine_kind(self._node.param("engine")).simulated:
            return f"simulated ({self._node.param('hw_profile')})"
        engine = self._node.server.engine if self._node.server is not None else None
        return str(getattr(engine, "device", "") or "")
