"""Start timely_llm_server with config/timely_llm.yaml (or params_file:=...)."""

from pathlib import Path

from ament_index_python.packages import get_package_share_directory
from launch.actions import DeclareLaunchArgument
from launch.substitutions import LaunchConfiguration
from launch_ros.actions import Node

from launch import LaunchDescription


def generate_launch_description() -> LaunchDescription:
    default_params = Path(get_package_share_directory("timely_llm")) / "config" / "timely_llm.yaml"
    return LaunchDescription([
        DeclareLaunchArgument("params_file", default_value=str(default_params)),
        Node(package="timely_llm", executable="timely-llm", name="timely_llm_server", output="screen",
             arguments=["serve"], parameters=[LaunchConfiguration("params_file")]),
    ])
