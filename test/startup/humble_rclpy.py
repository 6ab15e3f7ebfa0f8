"""Jazzy's rclpy made to lack what Humble's lacks, before a node starts: every rclpy name of the table in
../shared/rclpy-humble/README.md (ros2/rclpy's ``humble`` and ``jazzy`` branches compared) is removed.

- a module Humble does not have: rclpy's own modules are imported first (Jazzy's rclpy uses these inside), then
  importing it fails and its package hides it;
- a module-level name, a class member: rclpy's own code reaches them as before (Jazzy's ``rclpy.time`` reads its
  ``ClockType``, its executor ``Subscription.callback``, its parameter service calls ``Node.list_parameters``); any
  other code gets an AttributeError (an ImportError from ``from M import NAME``), as on Humble.

``rclpy.qos_event`` (``*`` in the table: Jazzy's re-exports ``event_handler``; Humble's has names of its own) is
left as it is. Applied by ``sitecustomize`` (this directory on PYTHONPATH, TIMELY_LLM_TEST_HUMBLE_RCLPY=1).
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
import types
import warnings

MISSING_MODULES = ("rclpy.clock_type", "rclpy.destroyable", "rclpy.event_handler", "rclpy.logging_service",
                   "rclpy.parameter_client", "rclpy.parameter_event_handler", "rclpy.service_introspection",
                   "rclpy.type_description_service", "rclpy.type_hash")
MISSING_NAMES = {
    "rclpy.client": ("Client.configure_introspection", "Client.service_name", "Clock", "ServiceIntrospectionState"),
    "rclpy.clock": ("ClockHandle", "Context", "DestroyableType", "TimeHandle", "TimeJumpDictionary"),
    "rclpy.context": ("ContextHandle", "DestroyableType"),
    "rclpy.duration": ("DurationType",),
    "rclpy.logging": ("RcutilsLogger", "get_logger_level"),
    "rclpy.node": ("ListParameters", "ListParametersResult", "LoggingService", "Node.add_post_set_parameters_callback",
                   "Node.add_pre_set_parameters_callback", "Node.count_clients", "Node.count_services",
                   "Node.get_fully_qualified_node_names", "Node.list_parameters",
                   "Node.remove_post_set_parameters_callback", "Node.remove_pre_set_parameters_callback",
                   "Node.wait_for_node", "TypeDescriptionService"),
    "rclpy.parameter": ("get_parameter_value", "parameter_dict_from_yaml_file"),
    "rclpy.parameter_service": ("ListParametersResult",),
    "rclpy.publisher": ("EventHandler",),
    "rclpy.qos": ("DeadlineBestAvailable", "LivelinessLeaseDurationeBestAvailable", "qos_profile_best_available",
                  "qos_profile_default"),
    "rclpy.qos_overriding_options": ("QoSDurabilityPolicy", "QoSHistoryPolicy", "QoSLivelinessPolicy",
                                     "QoSProfileAttributes", "QoSReliabilityPolicy"),
    "rclpy.service": ("Clock", "Service.configure_introspection", "Service.service_name", "ServiceIntrospectionState"),
    "rclpy.subscription": ("EventHandler", "Subscription.callback", "Subscription.get_publisher_count"),
    "rclpy.time": ("ClockType", "S_TO_NS", "TimeHandle"),
    "rclpy.timer": ("CallbackGroup", "Clock", "Context"),
    "rclpy.topic_endpoint_info": ("TopicEndpointInfo.topic_type_hash", "TypeHash"),
}
"""Module-level names and class members (``Class.member``) that Humble's rclpy lacks. The table's members of a
class that is itself missing (``ClockHandle.get_now``, ...) go with their class."""


class RclpyOnly:
    """A class member Humble lacks: rclpy's own code gets it, other code an AttributeError."""

    def __init__(self, owner: type, name: str) -> None:
        self._member, self._where = owner.__dict__[name], f"{owner.__module__}.{owner.__name__}.{name}"

    def __get__(self, obj: object, objtype: type | None = None) -> object:
        if not _called_from_rclpy():
            raise AttributeError(f"{self._where}: Humble's rclpy has no such name")
        return self._member.__get__(obj, objtype) if hasattr(self._member, "__get__") else self._member

    def __set__(self, obj: object, value: object) -> None:
        if not _called_from_rclpy():
            raise AttributeError(f"{self._where}: Humble's rclpy has no such name")
        self._member.__set__(obj, value)


class HumbleModule(types.ModuleType):
    """A module whose names in ``_humble_lacks`` only rclpy's own code reaches (its functions read their globals
    from the module's dict, which keeps them)."""

    def __getattribute__(self, name: str) -> object:
        if name in super().__getattribute__("_humble_lacks") and not _called_from_rclpy():
            raise AttributeError(f"module {super().__getattribute__('__name__')!r}: Humble's rclpy has no {name!r}")
        return super().__getattribute__(name)


def _called_from_rclpy() -> bool:
    caller = sys._getframe(2).f_globals.get("__name__", "")
    return caller == "rclpy" or caller.startswith("rclpy.")


def _hide(module: types.ModuleType, name: str) -> None:
    if not isinstance(module, HumbleModule):
        module._humble_lacks = set()
        module.__class__ = HumbleModule
    module._humble_lacks.add(name)


def strip() -> None:
    """Remove from rclpy every name Humble's lacks (see the module's docstring)."""
    import rclpy

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # rclpy.qos_event's deprecation
        for module in pkgutil.walk_packages(rclpy.__path__, "rclpy."):
            if not module.name.rpartition(".")[2].startswith("_"):  # _rclpy_pybind11 and the like load themselves
                importlib.import_module(module.name)
    for name in MISSING_MODULES:
        package, _, leaf = name.rpartition(".")
        _hide(sys.modules[package], leaf)
        sys.modules[name] = None  # import fails
    for module_name, names in MISSING_NAMES.items():
        module = sys.modules[module_name]
        for name in names:
            owner_name, _, member = name.partition(".")
            if member:
                owner = module.__dict__[owner_name]
                setattr(owner, member, RclpyOnly(owner, member))
            else:
                _hide(module, name)
