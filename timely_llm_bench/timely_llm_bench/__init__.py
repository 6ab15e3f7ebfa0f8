"""timely_llm's benchmarks and demo: ``evaluation`` (simulator and real-engine benchmarks, plots), ``workloads``
(WID1-3, closed-loop, peer), ``robots`` (fleets over ROS 2, load and traffic benchmarks, simulated robots, the Tello
UDP simulator) and ``cli`` (their ``timely-llm`` commands)."""
