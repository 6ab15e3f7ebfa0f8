"""The ROS 2 layer: the ``timely_llm_server`` node over the server loop, robot clients, the fleet and ROS benchmarks."""
