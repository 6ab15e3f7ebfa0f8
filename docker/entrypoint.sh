#!/usr/bin/env bash
# The images' entry point: source ROS and the workspace, then launch the node with the launch arguments given
# (policy:=fcfs engine:=remote ...). REMOTE_URL (and REMOTE_MAX_NUM_SEQS, the server's --max-num-seqs), when set,
# go into a copy of the shipped parameters file as remote.url and remote.max_num_seqs.
set -eo pipefail
. "/opt/ros/${ROS_DISTRO}/setup.bash"
. /ws/install/setup.bash
if [ -z "${REMOTE_URL:-}" ]; then
  exec ros2 launch timely_llm timely_llm.launch.py "$@"
fi
python3 - <<'PY'
import os
import yaml
from ament_index_python.packages import get_package_share_directory

shipped = os.path.join(get_package_share_directory("timely_llm"), "config", "timely_llm.yaml")
with open(shipped) as f:
    params = yaml.safe_load(f)
node = params["/**"]["ros__parameters"]
node["remote"] = {**node.get("remote", {}), "url": os.environ["REMOTE_URL"],
                  "max_num_seqs": int(os.environ.get("REMOTE_MAX_NUM_SEQS", "16"))}
with open("/tmp/timely_llm.yaml", "w") as f:
    yaml.safe_dump(params, f)
PY
exec ros2 launch timely_llm timely_llm.launch.py params_file:=/tmp/timely_llm.yaml "$@"
