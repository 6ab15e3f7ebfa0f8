"""The node's ROS interfaces (package timely_llm_interfaces), imported from one place so their package can move
without touching users."""

from timely_llm_interfaces.action import RequestPlan
from timely_llm_interfaces.msg import (
    CategoryStatus,
    PlanResult,
    Segment,
    SegmentDone,
    ServerStatus,
    SkillCall,
    TaskRequest,
)

__all__ = ["CategoryStatus", "PlanResult", "RequestPlan", "Segment", "SegmentDone", "ServerStatus", "SkillCall",
           "TaskRequest"]
