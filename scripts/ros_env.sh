# Source me: . scripts/ros_env.sh VENV BUILD_DIR
# Puts the ROS 2 wheels in VENV and the timely_llm_interfaces built by
# scripts/build_interfaces.sh into BUILD_DIR/install on the search paths.
# shellcheck shell=bash

_ros_env_setup() {
  local venv install py_version ros_libs
  venv="$(realpath -m "${1:?usage: . scripts/ros_env.sh VENV BUILD_DIR}")"
  install="$(realpath -m "${2:?usage: . scripts/ros_env.sh VENV BUILD_DIR}")/install"
  py_version="$("$venv/bin/python" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')"
  # Wheel-vendored shared libraries live in site-packages/ros_*.libs.
  ros_libs="$(find "$venv/lib/python$py_version/site-packages" -maxdepth 1 -type d -name 'ros_*.libs' -printf '%p:')"

  export VIRTUAL_ENV="$venv"
  export PATH="$venv/bin:$PATH"
  export AMENT_PREFIX_PATH="$install:$venv${AMENT_PREFIX_PATH:+:$AMENT_PREFIX_PATH}"
  export PYTHONPATH="$install/lib/python$py_version/site-packages${PYTHONPATH:+:$PYTHONPATH}"
  export LD_LIBRARY_PATH="$install/lib:$venv/lib:$ros_libs${LD_LIBRARY_PATH:-}"
  export LD_LIBRARY_PATH="${LD_LIBRARY_PATH%:}"
  export RMW_IMPLEMENTATION="${RMW_IMPLEMENTATION:-rmw_fastrtps_cpp}"
}

_ros_env_setup "$@"
unset -f _ros_env_setup
