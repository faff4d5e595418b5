"""`atomic_write`: readers see the old file or the whole new one; concurrent writers of one path never collide."""

from __future__ import annotations

import os
import threading

import pytest

from trl_agents.fileio import atomic_write


class Killed(BaseException):
    """Stands for the process being killed mid-write."""


def test_text_bytes_and_a_writer_function_land_whole(tmp_path):
    assert atomic_write(tmp_path / "new" / "a.json", '{"é": 1}') == str(tmp_path / "new" / "a.json")
    assert (tmp_path / "new" / "a.json").read_text(encoding="utf-8") == '{"é": 1}'  # folder created, UTF-8
    atomic_write(tmp_path / "b.bin", b"\x00\x01")
    atomic_write(tmp_path / "c.bin", lambda handle: handle.write(b"streamed"), fsync=False)
    assert (tmp_path / "b.bin").read_bytes() == b"\x00\x01" and (tmp_path / "c.bin").read_bytes() == b"streamed"
    assert sorted(os.listdir(tmp_path)) == ["b.bin", "c.bin", "new"]  # no temporary file left


def test_a_write_killed_midway_leaves_the_old_file_and_a_hidden_temporary(tmp_path):
    path = tmp_path / "metrics.json"
    atomic_write(path, "old")

    def write_half_then_die(handle):
        handle.write(b"ne")
        raise Killed

    with pytest.raises(Killed):
        atomic_write(path, write_half_then_die)
    assert path.read_text() == "old"
    leftover = f".metrics.json.{os.getpid()}.{threading.get_ident()}.tmp"  # this writer's own temporary name
    assert sorted(os.listdir(tmp_path)) == [leftover, "metrics.json"]


def test_concurrent_writers_of_one_path_each_use_their_own_temporary(tmp_path):
    path = tmp_path / "game.json"
    texts = [str(index) * 100_000 for index in range(8)]
    errors = []

    def write(text):
        try:
            for _ in range(5):
                atomic_write(path, text, fsync=False)
        except Exception as err:  # a shared temporary name fails the other writer's rename
            errors.append(err)

    threads = [threading.Thread(target=write, args=(text,)) for text in texts]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert path.read_text() in texts and os.listdir(tmp_path) == ["game.json"]
