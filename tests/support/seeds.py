"""Seeds of the randomised GPU tests: fresh each run and printed, or TROPICAL_TEST_SEED's, so
that a failure can be drawn again."""

from __future__ import annotations

import os
import random

import numpy as np

__all__ = ["seeded"]


def seeded(what: str) -> np.random.Generator:
    """A generator from a fresh seed (or ``$TROPICAL_TEST_SEED``), printed with ``what`` it is
    for."""
    seed = int(os.environ.get("TROPICAL_TEST_SEED") or random.SystemRandom().randrange(1 << 63))
    print(f"{what}: seed {seed} (TROPICAL_TEST_SEED={seed} draws it again)")
    return np.random.default_rng(seed)
