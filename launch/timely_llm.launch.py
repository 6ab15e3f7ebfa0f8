"""Start the timely_llm_server lifecycle node, active (configured and serving goals) unless ``autostart:=false``.

    ros2 launch timely_llm timely_llm.launch.py [params_file:=F] [engine:=vllm|remote|sim] [policy:=P] [model:=M]
                                                [vllm_args:="KEY:=VALUE ..."] [hw_profile:=NAME] [namespace:=NS]
                                                [autostart:=true|false] [use_sim_time:=true|false]
                                                [log_level:=debug|info|warn|error|fatal]

Parameters come from ``params_file`` (default: the installed config/timely_llm.yaml); each of engine, policy,
model and hw_profile given on the command line overrides the file, and so does each vLLM engine argument in
``vllm_args`` (space-separated ``KEY:=VALUE``, e.g. ``vllm_args:="max_model_len:=4096 dtype:=float16"``: the node's
parameters ``vllm.KEY``, values read as ``-p`` reads them). The node is a ``launch_ros`` LifecycleNode, so launch's
lifecycle events (ChangeState, OnStateTransition) drive it as they drive any managed node. ``autostart:=true`` (the
default) has the node configure and activate itself; give ``autostart:=false`` when a lifecycle manager drives it
(nav2_lifecycle_manager with the node in its ``node_names``, or launch's ChangeState): the node then waits
unconfigured for its transitions (configure, activate). ``use_sim_time:=true`` puts the node on /clock (segment,
status and report stamps); ``log_level`` is the node's ``--ros-args --log-level``. With ``namespace:=NS`` the node is
/NS/timely_llm_server and its action and topics are /NS/request_plan, /NS/<agent_id>/segment_done, /NS/status;
a params file keyed ``/**:`` (as the shipped one is) applies there, one keyed ``timely_llm_server:`` would not.
"""

import os

from ament_index_python.packages import get_package_share_directory
from launch.actions import DeclareLaunchArgument, OpaqueFunction
from launch.launch_context import LaunchContext
from launch.substitutions import LaunchConfiguration
from launch_ros.actions import LifecycleNode
from launch_ros.parameter_descriptions import ParameterValue

from launch import LaunchDescription
from timely_llm.core.policies import POLICIES
from timely_llm.engines.registry import engines_help
from timely_llm.engines.vllm_args import PREFIX as VLLM_PREFIX
from timely_llm.engines.vllm_args import parse_assignments

OVERRIDES = {
    "engine": engines_help(),
    "policy": ", ".join(POLICIES),
    "model": "vllm: smollm2 (default), tiny, a model directory or a Hugging Face model id",
    "hw_profile": "sim: hardware profile name or YAML file",
}
LOG_LEVELS = ["debug", "info", "warn", "error", "fatal"]


def generate_launch_description() -> LaunchDescription:
    default_params = os.path.join(get_package_share_directory("timely_llm"), "config", "timely_llm.yaml")
    return LaunchDescription([
        DeclareLaunchArgument("params_file", default_value=default_params, description="node parameters YAML"),
        DeclareLaunchArgument("namespace", default_value="", description="namespace of the node"),
        DeclareLaunchArgument("autostart", default_value="true", choices=["true", "false"],
                              description="configure and activate the node at startup; false where a lifecycle "
                                          "manager (nav2_lifecycle_manager, launch's ChangeState) drives it"),
        DeclareLaunchArgument("use_sim_time", default_value="false", choices=["true", "false"],
                              description="use /clock for the node's ROS time"),
        DeclareLaunchArgument("log_level", default_value="info", choices=LOG_LEVELS,
                              description="the node's log level (--ros-args --log-level)"),
        *(DeclareLaunchArgument(name, default_value="", description=f"{text}; empty: as in params_file")
          for name, text in OVERRIDES.items()),
        DeclareLaunchArgument("vllm_args", default_value="",
                              description='vLLM engine arguments "KEY:=VALUE ..." (EngineArgs fields), each '
                                          "overriding params_file's vllm.KEY"),
        OpaqueFunction(function=_server_node),
    ])


def _server_node(context: LaunchContext) -> list[LifecycleNode]:
    given = [name for name in OVERRIDES if LaunchConfiguration(name).perform(context)]
    overrides = {name: ParameterValue(LaunchConfiguration(name), value_type=str) for name in given}
    engine_args = parse_assignments(LaunchConfiguration("vllm_args").perform(context).split(), ":=")
    overrides |= {f"{VLLM_PREFIX}{key}": value for key, value in engine_args.items()}
    return [LifecycleNode(
        package="timely_llm",
        executable="timely-llm",
        arguments=["serve"],
        ros_arguments=["--log-level", LaunchConfiguration("log_level")],
        name="timely_llm_server",
        namespace=LaunchConfiguration("namespace"),
        output="screen",
        parameters=[LaunchConfiguration("params_file"),
                    {"autostart": ParameterValue(LaunchConfiguration("autostart"), value_type=bool),
                     "use_sim_time": ParameterValue(LaunchConfiguration("use_sim_time"), value_type=bool),
                     **overrides}],
    )]
