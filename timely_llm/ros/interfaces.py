"""The node's ROS interfaces, imported from one place so their package can move without touching users."""

from timely_llm_interfaces.action import RequestPlan
from timely_llm_interfaces.msg import Segment, SegmentDone, ServerStatus, SkillCall

__all__ = ["RequestPlan", "Segment", "SegmentDone", "ServerStatus", "SkillCall"]
