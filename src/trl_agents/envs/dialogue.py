"""What two-role text games share: alternating turns, a scripted partner for one role, and messages of free talk plus
one structured move (`dealnodeal`, `telesales`).

`AlternatingRoles` is a mixin for an `AgentEnv` with `roles` whose state `_game` counts its messages (`turn`) and
which takes `opponent` ("self": the policy plays every role in turn; "scripted": a rule-based partner plays the
other one inside `step()`), `agent_role` and `self_play_reward` ("mean" or "acting"). A game's messages are
`Message`s (a subclass names the roles and renders its moves' tags); `message_text` renders a message the way both
roles see it.

Example:
    >>> message_text("I would like most of the hats, since", "[Propose: book=0, hat=2, ball=1]", max_chars=12)
    'I would like... [Propose: book=0, hat=2, ball=1]'
    >>> message_text("", "[Accept]", max_chars=12)
    '[Accept]'
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

from .base import INFO_SUCCESS, INFO_VALID


def message_text(talk: str, tag: str, max_chars: int) -> str:
    """A message as both roles see it: the talk, cut at `max_chars` (an ellipsis marks the cut), then the move's
    canonical tag (moves are never cut); either may be empty."""
    if len(talk) > max_chars:
        talk = talk[:max_chars].rstrip() + "..."
    return " ".join(part for part in (talk, tag) if part)


@dataclass(frozen=True)
class Message(ABC):
    """One message of a two-role game: the index (in `roles`) of the role that wrote it and its move, which carries
    the free talk (`move.talk`); a subclass sets `roles` and renders the move's canonical tag (`tag`)."""

    role_index: int
    move: Any
    roles: ClassVar[tuple[str, ...]] = ()

    @abstractmethod
    def tag(self) -> str:
        """The move's canonical tag, e.g. `[Accept]` ('' for plain talk)."""

    def text(self, max_chars: int) -> str:
        """The message as both roles see it: the talk (cut at `max_chars`) and the canonical move tag."""
        return message_text(self.move.talk, self.tag(), max_chars)

    def line(self, max_chars: int) -> str:
        """The message in the dialogue transcript: `Role: text`."""
        return f"{self.roles[self.role_index].capitalize()}: {self.text(max_chars)}"


class AlternatingRoles:
    """Turn-taking of a two-role game (see the module docstring for what the environment must hold)."""

    roles: tuple[str, ...]
    opponent: str
    agent_role: str
    self_play_reward: str

    def _agent_index(self) -> int:
        return self.roles.index(self.agent_role)

    def _acting_index(self) -> int:
        return self._game.turn % len(self.roles)

    def current_role(self) -> str:
        """The role whose message the next `step()` takes (always `agent_role` against the scripted partner)."""
        return self.agent_role if self.opponent == "scripted" else self.roles[self._acting_index()]

    def _final_reward(self, role_rewards: dict[str, float], last: int) -> float:
        """The single reward of the last step: the agent's against the scripted partner; in self-play the mean of
        every role's reward or the reward of `last`, the role that took the last step (`self_play_reward`)."""
        if self.opponent == "scripted":
            return role_rewards[self.agent_role]
        if self.self_play_reward == "mean":
            return sum(role_rewards.values()) / len(role_rewards)
        return role_rewards[self.roles[last]]

    def _invalid_message(self, acting: int, error: str) -> tuple[str, float, bool, dict[str, Any]]:
        """The step result of a message the game refuses: nothing changes and the same role writes again."""
        info = {INFO_VALID: False, INFO_SUCCESS: False, "role": self.roles[acting], "move": None, "error": error}
        return f"Invalid message: {error}\n\n{self.render()}", 0.0, False, info
