"""The robot side of timely_llm: ``client`` (``RobotClient`` over the ``request_plan`` action), ``topic_client``
(``TopicRobotClient`` over topics) and ``executors`` (the MiniSpec interpreter, arm and mobile-base simulators, a
Tello through djitellopy, imported only by ``executors.tello``)."""
