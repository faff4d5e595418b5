"""Training rows and their split into micro-batches (no row dropped, padding trimmed)."""

from __future__ import annotations

import pytest
import torch

from trl_agents.training.batch import split_rows
from trl_agents.training.rows import build_rows
from trl_agents.trajectory import Group, Step, Trajectory


def test_step_rows_broadcast_and_per_token_advantages():
    steps = [Step("a", "x", prompt_ids=[1], action_ids=[2, 3]), Step("b", "y", prompt_ids=[1, 4], action_ids=[5])]
    group = Group({}, [Trajectory({}, steps)])
    rows = build_rows([group], [[[0.5, [1.0]]]], "step")
    assert rows.prompt_ids == [[1], [1, 4]] and rows.completion_ids == [[2, 3], [5]]
    assert rows.advantages == [[0.5, 0.5], [1.0]] and rows.env_mask == [[1, 1], [1]]
    with pytest.raises(ValueError, match="2 values for an action of 1 tokens"):
        build_rows([group], [[[0.5, [1.0, 2.0]]]], "step")


def padded_batch(num_rows):
    prompt_ids = torch.zeros(num_rows, 6, dtype=torch.long)
    prompt_mask = torch.zeros(num_rows, 6, dtype=torch.long)
    completion_mask = torch.zeros(num_rows, 5, dtype=torch.long)
    for row in range(num_rows):
        prompt_mask[row, 6 - (row % 3 + 1) :] = 1  # prompt lengths 1..3 (left-padded)
        completion_mask[row, : row % 4 + 1] = 1  # completion lengths 1..4 (right-padded)
    return {
        "prompt_ids": prompt_ids,
        "prompt_mask": prompt_mask,
        "completion_ids": torch.arange(num_rows).unsqueeze(1).repeat(1, 5),
        "completion_mask": completion_mask,
        "advantages": torch.ones(num_rows, 5),
        "num_items_in_batch": torch.tensor(7.0),
        "tags": list(range(num_rows)),
    }


def test_split_keeps_every_row_once_and_trims_padding():
    chunks = split_rows(padded_batch(10), 3)
    assert [c["prompt_ids"].shape[0] for c in chunks] == [4, 3, 3]
    assert sorted(t for c in chunks for t in c["tags"]) == list(range(10))
    seen = sorted(int(c["completion_ids"][r, 0]) for c in chunks for r in range(c["completion_ids"].shape[0]))
    assert seen == list(range(10))
    # rows 0-3: prompt lengths 1,2,3,1 -> width 3; completion lengths 1,2,3,4 -> width 4
    assert chunks[0]["prompt_ids"].shape == (4, 3) and chunks[0]["completion_mask"].shape == (4, 4)
    assert chunks[0]["advantages"].shape == (4, 4)
    assert all(c["num_items_in_batch"].item() == 7.0 for c in chunks)  # 0-d tensors are shared, not split


def test_split_needs_a_row_per_chunk():
    with pytest.raises(ValueError, match="cannot split 2 rows into 3"):
        split_rows(padded_batch(2), 3)
