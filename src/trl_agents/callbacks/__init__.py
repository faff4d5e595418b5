"""Callbacks: training-time monitors, controllers and schedules."""

from .budget import TimeBudgetCallback
from .console import CompactPrinterCallback, CompactProgressCallback, compact_line, use_compact_console
from .dark_room import DarkRoomMonitor

__all__ = [
    "CompactPrinterCallback",
    "CompactProgressCallback",
    "DarkRoomMonitor",
    "TimeBudgetCallback",
    "compact_line",
    "use_compact_console",
]
