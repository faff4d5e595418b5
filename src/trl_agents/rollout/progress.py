"""A live progress display of rollouts (rich): episodes finished out of the total, the turn, successes so far.

The rollout engine reports a `TurnProgress` after the resets and after every turn (its `on_turn` callback);
`RolloutProgress.update` draws it. The trainer shows one on the main process unless `disable_tqdm` is set (TRL's
switch for progress bars); `trl-agents eval` shows one on stderr. On a terminal the bar is redrawn in place and
removed at the end of the rollout (`transient=True`); elsewhere (a log file, CI) nothing is drawn unless
`transient=False`, which prints the final state once.

Example:
    >>> from io import StringIO
    >>> from rich.console import Console
    >>> from trl_agents.rollout import RolloutProgress, TurnProgress
    >>> out = StringIO()
    >>> progress = RolloutProgress("rollout", console=Console(file=out, width=90), transient=False)
    >>> with progress.track():
    ...     progress.update(TurnProgress(turn=3, max_turns=3, num_episodes=8, finished=8, successes=3, failed=0))
    >>> print(out.getvalue().strip())
    rollout ━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━ 8/8 episodes turn 3/3 solved 3/8 0:00:00
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from .engine import TurnProgress


class RolloutProgress:
    """Live progress of the rollouts run inside `track()`, fed by `update` (the engine's `on_turn`).

    Args:
        description: Label of the bar (e.g. "rollout", "eval sokoban").
        console: The rich `Console` to draw on; by default one on stderr, where TRL's progress bars go too, so that
            standard output stays clean (e.g. `trl-agents eval` prints its JSON result there).
        transient: Remove the bar when the rollout ends. On a console that is not a terminal, a transient bar is not
            drawn at all.
    """

    def __init__(self, description: str = "rollout", console: Any = None, transient: bool = True):
        from rich.console import Console

        self.description = description
        self.console = console or Console(stderr=True)
        self.transient = transient
        self.last: TurnProgress | None = None  # the latest report, also kept once the rollout is over
        self._progress = None
        self._task = None

    @contextlib.contextmanager
    def track(self) -> Iterator[RolloutProgress]:
        """Show the bar while one rollout runs (even if it raises, the display is closed)."""
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self._progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("episodes {task.fields[status]}"),
            TimeElapsedColumn(),
            console=self.console,
            transient=self.transient,
            disable=self.transient and not self.console.is_terminal,
        )
        self._task = self._progress.add_task(self.description, total=None, status="")
        self.last = None
        try:
            with self._progress:
                yield self
        finally:
            self._progress, self._task = None, None

    def update(self, progress: TurnProgress) -> None:
        """Draw a report of the engine (ignored outside `track()`)."""
        self.last = progress
        if self._progress is None:
            return
        status = f"turn {progress.turn}/{progress.max_turns} solved {progress.successes}/{progress.finished}"
        if progress.failed:
            status += f" failed {progress.failed}"
        self._progress.update(self._task, total=progress.num_episodes, completed=progress.finished, status=status)
