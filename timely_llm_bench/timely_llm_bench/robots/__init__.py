"""The robots' side of the node's ROS interface: robot clients over the action and over topics, simulated fleets
that run them, and the ROS benchmarks that drive the node with them. The node (``timely_llm.ros``) imports none
of it."""
