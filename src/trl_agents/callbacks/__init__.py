"""Callbacks: training-time monitors, controllers and schedules."""

from .budget import TimeBudgetCallback
from .collapse import EchoTrapMonitor, RewardVarianceFilter
from .console import CompactPrinterCallback, CompactProgressCallback, compact_line, use_compact_console
from .control_tokens import ControlTokenMonitor
from .dark_room import DarkRoomMonitor

__all__ = [
    "CompactPrinterCallback",
    "CompactProgressCallback",
    "ControlTokenMonitor",
    "DarkRoomMonitor",
    "EchoTrapMonitor",
    "RewardVarianceFilter",
    "TimeBudgetCallback",
    "compact_line",
    "use_compact_console",
]
