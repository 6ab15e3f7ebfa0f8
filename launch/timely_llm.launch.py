"""Start the timely_llm_server node, active (configured and serving goals) unless ``autostart:=false``.

    ros2 launch timely_llm timely_llm.launch.py [params_file:=F] [engine:=vllm|remote|sim] [policy:=P] [model:=M]
                                                [vllm_args:="KEY:=VALUE ..."] [hw_profile:=NAME] [namespace:=NS]
                                                [autostart:=true|false]

Parameters come from ``params_file`` (default: the installed config/timely_llm.yaml); each of engine, policy,
model and hw_profile given on the command line overrides the file, and so does each vLLM engine argument in
``vllm_args`` (space-separated ``KEY:=VALUE``, e.g. ``vllm_args:="max_model_len:=4096 dtype:=float16"``: the node's
parameters ``vllm.KEY``, values read as ``-p`` reads them). With ``autostart:=false`` the lifecycle node
waits unconfigured for its transitions (configure, activate). With ``namespace:=NS`` the node is
/NS/timely_llm_server and its action and topics are /NS/request_plan, /NS/<agent_id>/segment_done, /NS/status;
a params file keyed ``/**:`` (as the shipped one is) applies there, one keyed ``timely_llm_server:`` would not.
"""

import os

from ament_index_python.packages import get_package_share_directory
from launch.actions import DeclareLaunchArgument, OpaqueFunction
from launch.launch_context import LaunchContext
from launch.substitutions import LaunchConfiguration
from launch_ros.actions import Node
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


def generate_launch_description() -> LaunchDescription:
    default_params = os.path.join(get_package_share_directory("timely_llm"), "config", "timely_llm.yaml")
    return LaunchDescription([
        DeclareLaunchArgument("params_file", default_value=default_params, description="node parameters YAML"),
        DeclareLaunchArgument("namespace", default_value="", description="namespace of the node"),
        DeclareLaunchArgument("autostart", default_value="true", choices=["true", "false"],
                              description="configure and activate the node at startup"),
        *(DeclareLaunchArgument(name, default_value="", description=f"{text}; empty: as in params_file")
          for name, text in OVERRIDES.items()),
        DeclareLaunchArgument("vllm_args", default_value="",
                              description='vLLM engine arguments "KEY:=VALUE ..." (EngineArgs fields), each '
                                          "overriding params_file's vllm.KEY"),
        OpaqueFunction(function=_server_node),
    ])


def _server_node(context: LaunchContext) -> list[Node]:
    given = [name for name in OVERRIDES if LaunchConfiguration(name).perform(context)]
    overrides = {name: ParameterValue(LaunchConfiguration(name), value_type=str) for name in given}
    engine_args = parse_assignments(LaunchConfiguration("vllm_args").perform(context).split(), ":=")
    overrides |= {f"{VLLM_PREFIX}{key}": value for key, value in engine_args.items()}
    return [Node(
        package="timely_llm",
        executable="timely-llm",
        arguments=["serve"],
        name="timely_llm_server",
        namespace=LaunchConfiguration("namespace"),
        output="screen",
        parameters=[LaunchConfiguration("params_file"),
                    {"autostart": LaunchConfiguration("autostart"), **overrides}],
    )]
