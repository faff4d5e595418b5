"""Callbacks: training-time monitors, controllers and schedules."""

from .budget import TimeBudgetCallback

__all__ = ["TimeBudgetCallback"]
