"""The arena an eager einsum's steps share (no GPU): offsets 256-byte aligned, space given back
taken again first fit, and the allocation's size the most ever taken at once."""

from __future__ import annotations

import pickle
import subprocess
import sys
from pathlib import Path

from aionvrtc import tropical
from aionvrtc.tropical.networks._steps import _Arena


def test_the_arena_reuses_what_is_given_back_and_keeps_its_high_water_mark() -> None:
    arena = _Arena(reuse=True)
    assert arena.take(100) == 0
    assert arena.take(300) == 256  # aligned: 256 bytes taken for 100
    assert (arena.end, arena.size) == (768, 768)
    arena.give(256, 300)  # the top goes back, the size stays what was used
    assert (arena.end, arena.size) == (256, 768)
    assert arena.take(10) == 256
    arena.give(0, 100)
    assert arena.take(256) == 0  # first fit: the hole at the start
    assert arena.take(1) == 512
    arena.give(0, 256)
    arena.give(256, 10)  # neighbours merge into one hole of 512 bytes
    assert arena.take(512) == 0
    assert arena.size == 768
    assert arena.take(0) == 768  # an empty buffer still gets its own aligned place
    assert arena.size == 1024


def test_an_arena_without_reuse_never_takes_space_twice() -> None:
    arena = _Arena(reuse=False)
    first = arena.take(1000)
    arena.give(first, 1000)
    assert arena.take(1000) == 1024
    assert arena.size == 2048


def test_a_plan_from_another_process_keeps_a_key_of_its_own(tmp_path: Path) -> None:
    """Plans key the caches of what runs them by a number of their process: a plan pickled in
    another process (numbered from 0 there too) never takes the key of a plan of this one."""
    script = (
        "import pickle, sys\n"
        "from aionvrtc import tropical\n"
        "plan = tropical.einsum_plan('ij,jk->ik', (2, 3), (3, 4))\n"
        "sys.stdout.buffer.write(pickle.dumps(plan))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, check=True)
    theirs = pickle.loads(done.stdout)  # our own child's output
    ours = tropical.einsum_plan("abc,cd->abd", (2, 3, 4), (4, 5))
    assert theirs.key != ours.key
    assert theirs.key[0] != ours.key[0]  # another process's token
    assert theirs.key[1] >= 0
    # Equal plans made here share a key; a pickled one keeps its own.
    again = tropical.einsum_plan("abc,cd->abd", (2, 3, 4), (4, 5), optimize="greedy")
    assert again.key == ours.key
    assert pickle.loads(pickle.dumps(ours)).key == ours.key
