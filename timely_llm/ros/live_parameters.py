"""Parameters set at run time: refused with the reason when they cannot apply now, else applied at once (live ones;
configure-time ones wait for the next configure). Which is which: ``timely_llm.ros.parameters``.

The apply runs once rclpy has set the values (a post-set callback, Iron and later). Humble has only the check
callback, which runs before the values are set, once the descriptors (ranges, read-only) have passed: there the
check, once it accepts, applies the new values itself. The apply reads the changed parameters from the list it is
given, so both read the same values.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

from rcl_interfaces.msg import SetParametersResult
from rclpy.parameter import Parameter

from timely_llm.core.policies import serving_policy
from timely_llm.ros.engine_loader import default_tufs
from timely_llm.ros.goal_desk import GoalDesk
from timely_llm.ros.ledger import Ledger
from timely_llm.ros.parameters import refuse_while_configured
from timely_llm.ros.server_loop import ServerLoop, set_max_new_tokens, use_policy
from timely_llm.ros.server_node import Guard, ServerNode
from timely_llm.ros.status import StatusReporter


class LiveParameters:
    """The node's set-parameters callbacks: the check (any thread rclpy calls it on) and the post-set apply."""

    def __init__(self, node: ServerNode, loop: ServerLoop, ledger: Ledger, desk: GoalDesk, reporter: StatusReporter,
                 guarded: Guard) -> None:
        self._node, self._loop, self._ledger, self._desk, self._reporter = node, loop, ledger, desk, reporter
        apply = guarded(self._apply)
        if hasattr(node, "add_post_set_parameters_callback"):
            node.add_on_set_parameters_callback(self._check)
            node.add_post_set_parameters_callback(apply)
        else:  # Humble
            node.add_on_set_parameters_callback(functools.partial(_check_then_apply, self._check, apply))

    def _check(self, params: list[Parameter]) -> SetParametersResult:
        """Refuse what cannot apply now, with the reason (see timely_llm/ros/parameters.py)."""
        result = refuse_while_configured(params, self._node.lifecycle_state)
        if not result.successful:
            return result
        for p in params:
            if p.name == "policy":
                reason = self._policy_refusal(str(p.value))
                if reason:
                    return SetParametersResult(successful=False, reason=f"policy: {reason}")
        return result

    def _policy_refusal(self, name: str) -> str:
        try:
            policy = serving_policy(name)
        except ValueError as exc:
            return str(exc)
        server = self._node.server
        if server is not None and policy.mode != server.policy.mode:
            return (f"{name} serves in another mode than {server.policy.name} (segmented, streaming, adaptive "
                    "batch): set it while the node is unconfigured")
        if server is not None and policy.engine_scheduling != server.policy.engine_scheduling:
            return (f"{name} and {server.policy.name} differ in the engine's own scheduling (vLLM's "
                    "scheduling_policy, fixed when the engine starts): set it while the node is unconfigured")
        return ""

    def _apply(self, params: list[Parameter]) -> None:
        """Apply live parameters (configure-time ones wait for the next configure): ``params`` the ones set."""
        given = {p.name: p.value for p in params}
        names = set(given)

        def param(name: str) -> Any:
            return given[name] if name in given else self._node.param(name)

        rules = self._desk.rules if self._node.server is not None else None  # set together at configure
        if rules is not None and (names & {"max_task_chars", "max_prompt_tokens", "max_new_tokens"}
                                  or any(n.startswith("tuf.") for n in names)):
            self._desk.rules = dataclasses.replace(
                rules, default_tufs=default_tufs(param), max_prompt_tokens=param("max_prompt_tokens"),
                max_task_chars=param("max_task_chars"), max_new_tokens=param("max_new_tokens"))
        self._ledger.set_timeouts(param("segment_timeout_factor"), param("segment_timeout_margin"))
        if "status_period" in names:
            self._reporter.set_period(param("status_period"))
        if "max_new_tokens" in names:
            self._loop.send(functools.partial(set_max_new_tokens, param("max_new_tokens")))
        if "policy" in names:
            self._loop.send(functools.partial(use_policy, serving_policy(param("policy"))))
        self._node.get_logger().info(f"parameters set: {', '.join(sorted(names))}")


def _check_then_apply(check: Callable[[list[Parameter]], SetParametersResult],
                      apply: Callable[[list[Parameter]], None], params: list[Parameter]) -> SetParametersResult:
    result = check(params)
    if result.successful:
        apply(params)
    return result
