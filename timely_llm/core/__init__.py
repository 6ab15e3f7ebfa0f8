"""Scheduling core: time utility, priorities, queue, batch control, segmenter, skill models.

Nothing here imports ROS or vLLM.
"""
