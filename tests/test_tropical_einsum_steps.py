"""The arena an eager einsum's steps share (no GPU): offsets 256-byte aligned, space given back
taken again first fit, and the allocation's size the most ever taken at once."""

from __future__ import annotations

from aionvrtc.tropical._einsum_steps import _Arena


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
