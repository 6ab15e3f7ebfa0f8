"""The ``timely_llm_server`` ROS 2 node: a managed (lifecycle) front end over :class:`timely_llm.server.Server`.

Robots send ``RequestPlan`` goals (or ``task_requests`` on a topic); each plan segment comes back as feedback the
moment the server dispatches it, and the result once the robot has reported every segment executed
(on its own ``<agent_id>/segment_done``: ``agents``), or, for a goal with ``no_execution_reports``, once the
last segment's estimated execution end has passed. Lifecycle: configure loads the engine and starts the server
loop, activate accepts goals, deactivate aborts the goals in flight ("server deactivated"), cleanup frees the
engine, shutdown aborts what is in flight ("server shutting down") and waits briefly for the results to go out.
Parameter ``autostart`` (default true) configures and activates once the node spins, so no lifecycle manager is
needed.

Thread model. No thread waits on a goal, and only the server loop calls the Server.

- The executor (single-threaded in ``main``; a MultiThreadedExecutor where clients share the session) runs every
  ROS callback but the robots' own topics', which the topic pump's thread runs with an executor of its own
  (``agents``, ``topic_pump``). Goals, cancels and topic requests (``goal_desk``), robots' reports and the
  watchdog (``robot_reports``, on the node's ROS clock) are checked and time-stamped there and queued as commands
  in the loop's *inbox*. It also drains the *outbox*: feedback is published; a goal whose generation started goes
  EXECUTING with no execute callback scheduled (``rclpy_compat.mark_executing``: rclpy would resume a callback
  that waits for the result on every executor wake-up, a cost per goal in flight); an ended goal's execute
  callback runs once with its result (``rclpy_compat.conclude``), sets the final state and returns the result.
  Status and diagnostics (``status``) read the Server under its own lock.
- The server loop (``server_loop``, one thread per configured server) applies the inbox between engine steps. The
  Server's callbacks run on it and queue segments and ends in the outbox, then trigger a guard condition that
  wakes the executor.
- Transitions never run on the executor: ChangeState in a thread its coroutine callback awaits
  (``lifecycle_services``), autostart in a thread of its own. Configure waits there for a loader thread
  (``engine_loader``); cleanup and shutdown hand the engine to a release thread, shutdown the wait for the last
  results to a finalize thread.

Inbox and outbox are deques with one consumer each, so they need no lock. Locks: ``_transition_lock`` (an RLock)
lets one transition run at a time, from whichever thread asks; the Ledger's lock (``ledger``) guards what the
executor, the loop and the finalize thread share: the robots' reports, the goal handles still to conclude, the
status totals; TopicRequests' lock guards which topic request is whose, read by the reports' callback group too
(the per-agent endpoints, ``agents``, are made and dropped in the goals' callback group alone, and the topic pump's
thread, ``topic_pump``, takes the robots' reports and cancels off them);
the Server's own lock is held by the loop while it decides, and briefly by the status readers.
"""

from __future__ import annotations

import functools
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import rclpy
import rclpy.executors
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup
from rclpy.exceptions import InvalidParameterValueException
from rclpy.lifecycle import LifecycleState, TransitionCallbackReturn
from rclpy.parameter import Parameter
from rclpy.signals import SignalHandlerOptions
from timely_llm_interfaces.rclpy_compat import spinning

from timely_llm.clock import WallClock
from timely_llm.core.features import Features
from timely_llm.core.policies import POLICIES
from timely_llm.core.tuf import DEFAULT_TUFS
from timely_llm.engines.base import DEFAULT_MAX_NEW_TOKENS
from timely_llm.engines.keeper import EngineKeeper
from timely_llm.engines.registry import engines_help
from timely_llm.engines.remote_settings import parameters as remote_parameters
from timely_llm.engines.vllm_args import PREFIX as VLLM_PREFIX
from timely_llm.engines.vllm_args import shipped_parameters
from timely_llm.errors import ConfigError
from timely_llm.plan.robot_file import load_skill_models
from timely_llm.ros.dds_memory import size_history_to_samples
from timely_llm.ros.engine_loader import EngineLoader
from timely_llm.ros.goal_desk import GoalDesk, await_settled
from timely_llm.ros.goals import GoalRules
from timely_llm.ros.ledger import Ledger
from timely_llm.ros.lifecycle_services import regroup_lifecycle_services
from timely_llm.ros.live_parameters import LiveParameters
from timely_llm.ros.parameters import CONFIGURE_TIME_PREFIXES, descriptor
from timely_llm.ros.robot_reports import RobotReports
from timely_llm.ros.server_loop import ServerLoop
from timely_llm.ros.server_node import ServerNode
from timely_llm.ros.status import StatusReporter
from timely_llm.server import Server

NODE_EXECUTOR_THREADS = 1
"""The node's own process (``main``) spins a SingleThreadedExecutor: no callback of the node waits (transitions
run in threads of their own), and Jazzy's MultiThreadedExecutor costs several times the node's CPU per goal in
its own bookkeeping (README, "The loop's own cost")."""
SHUTDOWN_TIMEOUT_S = 1.5
"""Shutdown waits at most this long for the results of the goals it aborts to be handed to rclpy ..."""
RESULT_FLUSH_S = 0.3
"""... and then this long for rclpy to send them and for result requests still in flight to arrive."""
START_TIMEOUT_S = 1800.0
"""wait_active's default: a vLLM engine start takes minutes on a CPU."""

SHIPPED = object()
"""The default of a parameter that the shipped params file sets: that file's value, so the node run without a
params file serves what the launch file serves (config/timely_llm.yaml is the one source)."""

PARAMETERS: dict[str, tuple[object, str]] = {
    "autostart": (True, "configure and activate at startup (else wait for lifecycle transitions)"),
    "engine": (SHIPPED, f"the engine: {engines_help()}"),
    "model": (SHIPPED, "engine vllm: smollm2 (SmolLM2-135M-Instruct), tiny (random test model), a directory "
                       "or a Hugging Face model id"),
    "kv_cache_gib": (SHIPPED, "engine vllm: KV cache size in GiB; 0 = vLLM sizes it (vllm.gpu_memory_utilization)"),
    "hw_profile": (SHIPPED, "hardware profile name or YAML file for engine sim"),
    "estimator_profile": ("", "features timebill, deferred_prefill and ala's prior: the engine's step-time profile "
                              "(name or YAML file from timely-llm profile); empty = hw_profile on sim, the shipped "
                              "SmolLM2 fit on vllm"),
    "skill_models": (SHIPPED, "skill-model YAML files; empty = the shipped ones"),
    "policy": (SHIPPED, f"serving policy: {', '.join(POLICIES)} (timely-llm --help says what each does)"),
    "features": ("default", f"scheduler parts on: comma list of {', '.join(Features.names())}; all, none, default"),
    "max_batch": (SHIPPED, "batch cap: most generations at once, for the scheduler and the engine (vllm: vLLM's "
                           "max_num_seqs is this + 64 slots for paused ones; remote: at most remote.max_num_seqs x "
                           "servers); 0 = the engine's own (vLLM's default max_num_seqs; remote.max_num_seqs x "
                           "servers; 256 on the simulator)"),
    "network_latency": (SHIPPED, "one-way robot<->server latency in seconds; an unstamped SegmentDone was this "
                                  "long on its way"),
    "max_task_chars": (2000, "goals whose task text is longer are rejected"),
    "max_prompt_tokens": (SHIPPED, "goals whose prompt is longer are rejected (vllm: + max_new_tokens <= "
                                   "max_model_len)"),
    "max_new_tokens": (DEFAULT_MAX_NEW_TOKENS, "a plan's token budget: a goal's own max_new_tokens may ask for "
                                               "less, never more"),
    "fleet_file": ("", "fleet file (YAML): the robots that may ask, their robot types, priority classes and "
                       "quotas (docs/node.md, 'Fleet file'); empty = every agent, class urgent, default quotas"),
    "segment_timeout_factor": (SHIPPED, "a segment times out after factor x its estimated execution time ..."),
    "segment_timeout_margin": (SHIPPED, "... plus this many seconds"),
    "status_period": (SHIPPED, "seconds between ServerStatus messages"),
    "result_timeout": (10.0, "seconds an ended goal's result stays available to result requests (ROS: 900)"),
    **remote_parameters(),
    **{f"tuf.{c}.{k}": (v, f"default TUF {k} for {c} goals that give none")
       for c, tuf in DEFAULT_TUFS.items() for k, v in tuf.to_dict().items()},
}


def parameter_defaults() -> dict[str, object]:
    """Each parameter's default: the shipped params file's value where it sets one (an engine's section, e.g.
    ``vllm:``, as ``vllm.<field>``), else the code's (``PARAMETERS``)."""
    try:
        shipped = shipped_parameters()
    except OSError as exc:  # an installation without its share/timely_llm/config
        raise NodeStartError(f"no shipped params file: {exc.filename}: {exc.strerror}") from exc
    engine_args = {f"{prefix}{k}": v for prefix in CONFIGURE_TIME_PREFIXES
                   for k, v in (shipped.pop(prefix.rstrip("."), None) or {}).items()}
    missing = [name for name, (default, _) in PARAMETERS.items() if default is SHIPPED and name not in shipped]
    unknown = sorted(set(shipped) - set(PARAMETERS))
    if missing or unknown:  # an installation whose params file and code disagree
        raise NodeStartError(f"the shipped config/timely_llm.yaml lacks {missing} or has unknown {unknown}")
    return {name: shipped.get(name, default) for name, (default, _) in PARAMETERS.items()} | engine_args


def _engine_description(name: str) -> str:
    return "vLLM engine argument (EngineArgs field)" if name.startswith(VLLM_PREFIX) else "engine parameter"


def _transition(during: str, success: str, failure: str) -> Callable:
    """A transition callback that keeps the node's ``lifecycle_state``: ``during`` while it runs, then the state its
    result leads to (rclpy offers no public way to read the state machine's)."""
    def wrap(callback: Callable) -> Callable:
        @functools.wraps(callback)
        def run(node: TimelyLlmNode, state: LifecycleState) -> TransitionCallbackReturn:
            node._state = during
            result = TransitionCallbackReturn.ERROR
            try:
                result = callback(node, state)
            finally:
                node._state = {TransitionCallbackReturn.SUCCESS: success,
                               TransitionCallbackReturn.FAILURE: failure}.get(result, "errorprocessing")
            return result
        return run
    return wrap


class NodeStartError(RuntimeError):
    """The node cannot start (a parameter out of range, no robot type installed), or its autostart failed."""


class TimelyLlmNode(ServerNode):
    """The lifecycle and its parts: goal intake and delivery, robots' reports, status, live parameters."""

    def __init__(self, engines: EngineKeeper | None = None, **node_kwargs: Any) -> None:
        """``engines``: take the engine from this keeper and hand it back at cleanup instead of loading and closing
        one (nodes of one process one after another on one model load: ``timely-llm demo``)."""
        super().__init__("timely_llm_server", automatically_declare_parameters_from_overrides=True, **node_kwargs)
        self._state = "unconfigured"  # the lifecycle state, kept by the transition callbacks (``_transition``)
        self._declare_parameters()
        self.clock = WallClock()
        self.server: Server | None = None
        self.finalized = threading.Event()
        self.phase = "unconfigured"  # what the node is doing or last failed at, for the diagnostics
        self.configure_error = ""  # why the last configure failed ("" if it did not)
        self._start_error = ""
        self._started = threading.Event()  # autostart has run (or there is none)
        self._transition_lock = threading.RLock()  # one lifecycle transition at a time, from whichever thread
        self._shutting_down = threading.Event()  # a configure still loading the engine gives up
        self._transitions = MutuallyExclusiveCallbackGroup()  # ChangeState and autostart: may wait for the engine
        regroup_lifecycle_services(self, self._transitions, self._transition_lock)
        self.goals_group = MutuallyExclusiveCallbackGroup()  # goal, cancel, result requests, outbox: one at a time
        self._loop, self._ledger = ServerLoop(self.clock, self.get_logger()), Ledger()
        reports = RobotReports(self, self._loop, self._ledger, self._guarded)
        self._desk = GoalDesk(self, self._loop, self._ledger, self._guarded, reports.take)
        self._reporter = StatusReporter(self, self._loop, self._ledger, self._desk, self._guarded)
        LiveParameters(self, self._loop, self._ledger, self._desk, self._reporter, self._guarded)
        self._loader = EngineLoader(self, self.clock, self._desk, self._shutting_down, engines)
        self._check_skill_models()
        if self.param("autostart"):
            self._autostart_timer = self.create_timer(0.0, self._autostart, callback_group=self._transitions)
        else:
            self._open_request_interfaces()
            self._started.set()

    # ----- setup -----

    @property
    def goal_rules(self) -> GoalRules | None:
        """What the next goal is checked against (None until configured)."""
        return self._desk.rules

    @property
    def finished(self) -> int:
        """Requests ended since the node started (the status topic's ``finished``)."""
        return self._ledger.finished

    def _guarded(self, callback: Callable, on_error: object = None) -> Callable:
        """``callback`` that logs an exception instead of raising it into the executor (which would stop spinning)."""
        @functools.wraps(callback)
        def run(*args: object) -> object:
            try:
                return callback(*args)
            except Exception as exc:  # noqa: BLE001 - each callback ends what it concerns before this
                self.get_logger().error(f"{callback.__name__} failed: {exc!r}")
                return on_error
        return run

    def _declare_parameters(self) -> None:
        """The node's parameters (defaults: ``parameter_defaults``), and each engine parameter given (params file,
        ``-p``, launch) under an engine's prefix (``ENGINE_PREFIXES``): a ``vllm.<field>`` may be any vLLM EngineArgs
        field, checked by vLLM at configure, so which ones exist is vLLM's to say; one of an engine the node does not
        run fails configure. rclpy declares every parameter given at construction (the public way to see them);
        the node's own and the engines' are declared again here with their descriptors (and ranges)."""
        self.defaults = parameter_defaults()
        given = self.parameters_by_prefix("")
        engine_args = {name: p.value for name, p in given.items()
                       if name.startswith(CONFIGURE_TIME_PREFIXES) and name not in self.defaults}
        for name, default in (self.defaults | engine_args).items():
            description = PARAMETERS[name][1] if name in PARAMETERS else _engine_description(name)
            if name in given:
                self.undeclare_parameter(name)  # declared without a descriptor; its given value stays the override
            try:
                self.declare_parameter(name, default, descriptor(name, description, dynamic=name not in PARAMETERS))
            except InvalidParameterValueException as exc:
                raise NodeStartError(f"parameter {name}: {exc}") from exc

    def _check_skill_models(self) -> None:
        """With no skill_models given, the installation must ship some: else no restart could help."""
        if not [f for f in self.get_parameter_or("skill_models", Parameter("", value=[])).value or [] if f]:
            try:
                load_skill_models()
            except ConfigError as exc:
                raise NodeStartError(str(exc)) from exc

    def _open_request_interfaces(self) -> None:
        """The ``request_plan`` action and the ``task_requests`` topic. With ``autostart`` they open once autostart
        has run, so a client that waits for the server (as most do) finds the node active, not loading its engine."""
        self._desk.open(float(self.param("result_timeout")))

    def _autostart(self) -> None:
        """Once the node spins (a one-shot timer), configure and activate in a thread: off the executor, which
        may be single-threaded."""
        self._autostart_timer.cancel()
        threading.Thread(target=self._run_autostart, name="timely_llm_autostart", daemon=True).start()

    def _run_autostart(self) -> None:
        try:
            with self._transition_lock:
                if self._shutting_down.is_set():
                    self._start_error = "shut down before autostart"
                elif self.trigger_configure() != TransitionCallbackReturn.SUCCESS:
                    self._start_error = f"configure failed: {self.configure_error}"
                    self.get_logger().error(f"autostart: {self._start_error}; the node stays unconfigured "
                                            "(set its parameters and configure it again)")
                elif self._shutting_down.is_set() or self.trigger_activate() != TransitionCallbackReturn.SUCCESS:
                    self._start_error = "activate failed"
        except Exception as exc:  # noqa: BLE001 - raised into the executor, it would stop spinning
            self._start_error = f"autostart failed: {exc!r}"
            self.get_logger().error(self._start_error)
        finally:
            if not self._shutting_down.is_set():
                self._open_request_interfaces()
            self._started.set()

    def wait_active(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Until autostart has run; NodeStartError, with the reason, if it did not leave the node active."""
        if not self._started.wait(timeout_s):
            raise NodeStartError(f"autostart did not end in {timeout_s} s (is the node spinning?)")
        if self._start_error:
            raise NodeStartError(self._start_error)

    def trigger_configure(self) -> TransitionCallbackReturn:
        with self._transition_lock:
            return super().trigger_configure()

    def trigger_activate(self) -> TransitionCallbackReturn:
        with self._transition_lock:
            return super().trigger_activate()

    def trigger_deactivate(self) -> TransitionCallbackReturn:
        with self._transition_lock:
            return super().trigger_deactivate()

    def trigger_cleanup(self) -> TransitionCallbackReturn:
        with self._transition_lock:
            return super().trigger_cleanup()

    # ----- lifecycle -----

    @_transition("configuring", "inactive", "unconfigured")
    def on_configure(self, state: LifecycleState) -> TransitionCallbackReturn:
        """Load the engine in a thread of its own and wait for it here (off the executor: see the module)."""
        try:
            server, rules = self._loader.load(self._set_phase)
        except Exception as exc:  # noqa: BLE001 - any reason is reported and the node stays unconfigured
            self.configure_error = str(exc) or repr(exc)
            self.phase = f"configure failed: {self.configure_error}"
            self.get_logger().error(self.phase)
            return TransitionCallbackReturn.FAILURE
        self.configure_error = ""
        self._desk.rules = rules
        self._ledger.reset_reports(self.param("segment_timeout_factor"), self.param("segment_timeout_margin"))
        self._reporter.configured(server, self.param("engine"))
        self._loop.start(server)
        self.server = server
        self.phase = "inactive: configured, not accepting goals"
        self.get_logger().info(f"configured: engine {self.param('engine')}, policy {server.policy.name}, "
                               f"robots {', '.join(sorted(server.robots))}")
        return TransitionCallbackReturn.SUCCESS

    def _set_phase(self, phase: str) -> None:
        self.phase = phase

    @_transition("activating", "active", "inactive")
    def on_activate(self, state: LifecycleState) -> TransitionCallbackReturn:
        self._desk.serving = True
        self.phase = "active: accepting goals"
        self.get_logger().info(self.phase)
        return super().on_activate(state)

    @_transition("deactivating", "inactive", "active")
    def on_deactivate(self, state: LifecycleState) -> TransitionCallbackReturn:
        """Stop taking goals and abort those in flight, "server deactivated": a deactivate must answer at once,
        and draining could take as long as the robots take to execute their plans."""
        self._stop_serving("server deactivated")
        self.phase = "inactive: configured, not accepting goals"
        return super().on_deactivate(state)

    @_transition("cleaningup", "unconfigured", "inactive")
    def on_cleanup(self, state: LifecycleState) -> TransitionCallbackReturn:
        self._release_later()
        self.phase = "unconfigured"
        return TransitionCallbackReturn.SUCCESS

    @_transition("shuttingdown", "finalized", "finalized")
    def on_shutdown(self, state: LifecycleState) -> TransitionCallbackReturn:
        """Abort what is in flight ("server shutting down"); a thread waits for the results to go out, releases
        the engine and sets ``finalized`` (the transition itself waits for nothing)."""
        self._shutting_down.set()
        self._stop_serving("server shutting down")
        self.phase = "shutting down"
        threading.Thread(target=self._finalize, name="timely_llm_finalize", daemon=True).start()
        return TransitionCallbackReturn.SUCCESS

    @_transition("errorprocessing", "unconfigured", "finalized")
    def on_error(self, state: LifecycleState) -> TransitionCallbackReturn:
        self._stop_serving("server error")
        self._release_later()
        self.phase = "unconfigured after an error"
        return TransitionCallbackReturn.SUCCESS

    def _stop_serving(self, reason: str) -> None:
        """No more goals; those in flight end aborted with ``reason`` (by the loop, between engine steps)."""
        self._desk.serving = False
        self._loop.send(functools.partial(self._desk.abort_all, reason))

    def shutdown(self, timeout_s: float = SHUTDOWN_TIMEOUT_S + RESULT_FLUSH_S + 10.0) -> None:
        """The lifecycle's shutdown from whatever state the node is in (goals in flight end aborted, an engine
        still loading is given up), then wait until it is final."""
        self._shutting_down.set()
        with self._transition_lock:
            if not self.finalized.is_set() and self.lifecycle_state != "finalized":
                self.trigger_shutdown()
        if not self.finalized.wait(timeout_s):
            self.get_logger().warning(f"shutdown not final after {timeout_s} s")

    def destroy_node(self) -> None:
        self._desk.destroy()
        super().destroy_node()

    def _finalize(self) -> None:
        """Wait until every goal's final state is set, then a moment for rclpy to send the results; release."""
        await_settled(self._desk, time.monotonic() + SHUTDOWN_TIMEOUT_S)
        time.sleep(RESULT_FLUSH_S)
        self._release_later()
        self._loader.join()
        self.finalized.set()

    def _release_later(self) -> None:
        """Forget the server now; a thread stops its loop and frees the engine (see EngineLoader.release_later)."""
        server, self.server = self.server, None
        if server is not None:
            self._loader.release_later(server, self._loop)


def main(args: list[str] | None = None) -> int:
    """Run the node until SIGINT or SIGTERM; ``args`` are ROS arguments (e.g. ``--ros-args --params-file F``).

    On a signal the node goes through its lifecycle shutdown: every goal in flight ends
    ABORTED ("server shutting down") and its client gets the result, the engine is
    released, and the process exits 0. Exit code 1 if the node cannot start (a parameter out
    of its range, no robot type installed); a configure that fails leaves it running, unconfigured.
    """
    size_history_to_samples()
    rclpy.init(args=args, signal_handler_options=SignalHandlerOptions.NO)
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    try:
        node = TimelyLlmNode()
    except NodeStartError as exc:
        rclpy.logging.get_logger("timely_llm_server").fatal(str(exc))
        rclpy.try_shutdown()
        return 1
    with spinning(threads=NODE_EXECUTOR_THREADS) as executor:
        executor.add_node(node)
        while not stop.wait(0.2) and not node.finalized.is_set():
            pass
        node.shutdown()
    node.destroy_node()
    rclpy.try_shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
