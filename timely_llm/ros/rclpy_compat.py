"""rclpy names that moved between the distributions the node runs on (Humble, Jazzy): one import for each."""

try:  # Iron and later
    from rclpy.event_handler import PublisherEventCallbacks, SubscriptionEventCallbacks
except ImportError:  # Humble
    from rclpy.qos_event import PublisherEventCallbacks, SubscriptionEventCallbacks

__all__ = ["PublisherEventCallbacks", "SubscriptionEventCallbacks"]
