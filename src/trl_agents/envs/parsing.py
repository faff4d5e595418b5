"""Action parsing shared by the environments: where the answer is in a completion, and grid moves.

Example:
    >>> extract_answer("<think>maybe reveal 1 1</think>```reveal 2 3```")
    'reveal 2 3'
    >>> parse_direction("<think>the box is above me</think><action>Up</action>")
    'up'
    >>> parse_direction("up or down") is None
    True
"""

from __future__ import annotations

import re

DIRECTIONS: tuple[str, ...] = ("up", "down", "left", "right")

# The one-line feedback both grid environments put above the unchanged grid after an unparsable answer.
INVALID_DIRECTION_FEEDBACK = "Invalid action. Reply with one of: up, down, left, right."

_DIRECTION_WORD = re.compile(r"\b(up|down|left|right)\b", re.IGNORECASE)
# An answer wrapped in an <action> tag or a ``` fence (the CAST format, e.g. ```Up``` or ```text\nUp\n```).
_WRAPPED = re.compile(r"<action>(.*?)</action>|```(.*?)```", re.IGNORECASE | re.DOTALL)
# Reasoning is not the answer: "<think>left is a wall, so up</think> up" must parse to "up".
_THINK = re.compile(r"<think>.*?</think>", re.IGNORECASE | re.DOTALL)


def extract_answer(text: str) -> str:
    """The part of a model's raw output that holds its answer, stripped.

    That is the content of the last `<action>...</action>` block or ``` fenced block when the text has one (a
    fence's language tag line such as ```text is dropped), otherwise the whole text with complete
    `<think>...</think>` blocks removed. Every environment parses its action syntax from this region.
    """
    if not isinstance(text, str):
        return ""
    # Pick the block that starts last, whichever of the two kinds it is (the model's final answer).
    blocks = list(_WRAPPED.finditer(text))
    if not blocks:
        return _THINK.sub(" ", text).strip()
    last = blocks[-1]
    if last.group(1) is not None:
        return last.group(1).strip()
    fenced = last.group(2)
    first_line, newline, rest = fenced.partition("\n")
    if newline and rest.strip() and re.fullmatch(r"[A-Za-z0-9_+-]*", first_line.strip()):
        fenced = rest  # ```text\nUp\n``` -> "Up"
    return fenced.strip()


def parse_direction(text: str) -> str | None:
    """Parse one move from a model's raw output.

    The answer is searched inside the last `<action>...</action>` block or ``` fenced block when the text has one,
    otherwise in the whole text with complete `<think>...</think>` blocks removed. It is valid only when exactly one
    distinct direction word (`up`, `down`, `left`, `right`, any case, as a whole word) appears there.

    Args:
        text: The model's completion for one turn.

    Returns:
        `"up"`, `"down"`, `"left"` or `"right"`, or None when the text names no direction or several.
    """
    if not isinstance(text, str):
        return None
    found = {word.lower() for word in _DIRECTION_WORD.findall(extract_answer(text))}
    return found.pop() if len(found) == 1 else None
