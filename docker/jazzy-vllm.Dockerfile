# The node on ROS 2 Jazzy with the embedded vLLM engine, for an x86-64 machine with an NVIDIA GPU.
# UNVERIFIED: written without a Docker engine at hand (docs/deployment.md, "Images").
#   docker build -f docker/jazzy-vllm.Dockerfile -t timely_llm:jazzy-vllm .
#   docker run --gpus all --network host --ipc host timely_llm:jazzy-vllm \
#     policy:=timelyllm model:=Qwen/Qwen2.5-7B-Instruct      # launch arguments
FROM ros:jazzy-ros-base

# Jazzy's Python is Ubuntu 24.04's 3.12: vLLM goes into a venv that sees the ROS packages (rclpy, messages).
RUN apt-get update && apt-get install -y --no-install-recommends \
        python3-venv python3-dev build-essential git \
        ros-jazzy-diagnostic-msgs ros-jazzy-lifecycle-msgs \
    && rm -rf /var/lib/apt/lists/*
RUN python3 -m venv --system-site-packages /opt/venv \
    && /opt/venv/bin/pip install --no-cache-dir "vllm==0.32.0" tokenizers httpx numpy pyyaml
ENV PATH=/opt/venv/bin:$PATH

COPY . /src/timely_llm
WORKDIR /ws
RUN PACKAGES="timely_llm timely_llm_interfaces" bash /src/timely_llm/scripts/workspace.sh /ws \
    && . /opt/ros/jazzy/setup.sh \
    && colcon build --cmake-args -DBUILD_TESTING=OFF -DPython3_EXECUTABLE=/opt/venv/bin/python

COPY docker/entrypoint.sh /entrypoint.sh
ENTRYPOINT ["/entrypoint.sh"]
CMD []
