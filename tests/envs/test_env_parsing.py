"""Tests of the shared direction parser used by the grid environments."""

import pytest

from trl_agents.envs.parsing import DIRECTIONS, parse_direction


@pytest.mark.parametrize(
    "text",
    [
        "up",
        "Up",
        " UP\n",
        "<action>up</action>",
        "<think>go</think><action>Up</action>",
        "```Up```",
        "I move up",
        "```text\nup\n```",
        "<think>left is a wall, right too</think> up",  # reasoning outside the answer is ignored
        "<action>left</action> then <action>up</action>",  # the last block counts
        "```left``` ... ```up```",
        "up. UP! Up",  # the same direction repeated is still one direction
    ],
)
def test_parses_up(text):
    assert parse_direction(text) == "up"


@pytest.mark.parametrize(
    "text",
    [
        "",
        "jump",
        "up or down",
        "<action>north</action>",
        "<action>up down</action>",
        "upward",  # whole words only
        "move_up",
        None,
    ],
)
def test_rejects(text):
    assert parse_direction(text) is None


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_every_direction(direction):
    assert parse_direction(direction.upper()) == direction
    assert parse_direction(f"<action> {direction} </action>") == direction


def test_block_content_only():
    # When a block exists, words outside it do not count, even if the block has no direction.
    assert parse_direction("up <action>wait</action>") is None
    assert parse_direction("left ```down```") == "down"
    # The last block wins whichever kind it is.
    assert parse_direction("<action>up</action> ```down ```") == "down"
