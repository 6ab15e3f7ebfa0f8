"""The ROS 2 layer: the ``timely_llm_server`` lifecycle node over the server loop (``node``, ``server_loop``), goal
intake over the action and topics (``goal_desk``, ``topic_requests``), the robots' reports and the watchdog
(``robot_reports``), ``status`` and ``/diagnostics``, parameters, and ``timely-llm security-policy``.

Robot clients live in the package ``timely_llm_robot``; fleets and ROS benchmarks in ``timely_llm_bench``.
"""
