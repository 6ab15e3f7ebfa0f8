# Source me: . scripts/ros_env.sh VENV
# The ROS 2 environment of VENV (the Jazzy wheels, and the timely_llm_interfaces package that
# scripts/build_interfaces.sh installs there), as sourcing /opt/ros/jazzy/setup.bash gives on a ROS installation:
# `colcon build` and launch files need it. The timely-llm command does not: an activated venv is enough.
# (A second argument, the build directory that older versions took, is ignored.)
# shellcheck shell=bash

_ros_env_setup() {
  local venv py_version ros_libs
  venv="$(realpath -m "${1:?usage: . scripts/ros_env.sh VENV}")"
  py_version="$("$venv/bin/python" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')"
  # Wheel-vendored shared libraries live in site-packages/ros_*.libs.
  ros_libs="$(find "$venv/lib/python$py_version/site-packages" -maxdepth 1 -type d -name 'ros_*.libs' -printf '%p:')"

  export VIRTUAL_ENV="$venv"
  export PATH="$venv/bin:$PATH"
  export AMENT_PREFIX_PATH="$venv${AMENT_PREFIX_PATH:+:$AMENT_PREFIX_PATH}"
  export LD_LIBRARY_PATH="$venv/lib:$ros_libs${LD_LIBRARY_PATH:-}"
  export LD_LIBRARY_PATH="${LD_LIBRARY_PATH%:}"
  export RMW_IMPLEMENTATION="${RMW_IMPLEMENTATION:-rmw_fastrtps_cpp}"
}

_ros_env_setup "$@"
unset -f _ros_env_setup
