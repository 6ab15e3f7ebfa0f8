# The node on ROS 2 Humble (Jetson Orin: JetPack 6 is Ubuntu 22.04 with Python 3.10) with engine remote: no torch,
# no vLLM in the node's process; the model is served by a vLLM server beside it (docker/compose.jetson.yaml).
# UNVERIFIED: written without a Docker engine at hand (docs/deployment.md, "Images").
#   docker build -f docker/humble-remote.Dockerfile -t timely_llm:humble-remote .
FROM ros:humble-ros-base

RUN apt-get update && apt-get install -y --no-install-recommends \
        python3-pip python3-numpy python3-yaml \
        ros-humble-diagnostic-msgs ros-humble-lifecycle-msgs \
    && rm -rf /var/lib/apt/lists/*
RUN pip3 install --no-cache-dir httpx tokenizers

COPY . /src/timely_llm
WORKDIR /ws
RUN PACKAGES="timely_llm timely_llm_interfaces" bash /src/timely_llm/scripts/workspace.sh /ws \
    && . /opt/ros/humble/setup.sh \
    && colcon build --cmake-args -DBUILD_TESTING=OFF

COPY docker/entrypoint.sh /entrypoint.sh
ENTRYPOINT ["/entrypoint.sh"]
# Launch arguments; the server's URL comes from REMOTE_URL in compose.jetson.yaml.
CMD ["engine:=remote"]
