"""The node's ROS interfaces, imported from one place so their package can move without touching users."""

from timely_llm.action import RequestPlan
from timely_llm.msg import PlanResult, Segment, SegmentDone, ServerStatus, SkillCall, TaskRequest

__all__ = ["PlanResult", "RequestPlan", "Segment", "SegmentDone", "ServerStatus", "SkillCall", "TaskRequest"]
