"""Scheduling core: request state (``request``, ``places``), time utility (``tuf``), policies and priorities
(``policies``, ``priority``), the queue (``queue``), batch control (``batch``, ``throughput``, ``filling``,
``admission``), overload control (``overload``), TimeBill's estimator (``estimator``) and the scheduler's switchable
parts (``features``).

Nothing here imports ROS or vLLM. The segmenter and the skill models are the plan language's (``timely_llm.plan``).
"""
