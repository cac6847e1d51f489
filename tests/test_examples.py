"""The README's main example, as a newcomer runs it (without a GPU here: compile only)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from .conftest import has_gpu

ROOT = Path(__file__).resolve().parent.parent


def run_example(name: str, cache_dir: Path, *args: str) -> str:
    env = {**os.environ, "AIONVRTC_CACHE_DIR": str(cache_dir)}
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / name), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def example_module(name: str) -> Any:
    """examples/<name>.py imported as a module (its functions, without running main)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, ROOT / "examples" / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_quickstart_compiles_once_then_serves_from_disk(cache_dir: Path) -> None:
    if has_gpu():
        pytest.skip("with a GPU the example also runs its kernels: covered by gpu_suite.sh")
    first = run_example("quickstart.py", cache_dir)
    assert "no usable GPU for sm_90 here (NoDeviceError)" in first
    assert "100 requests, 1 compile(s), 99 joined, 0 disk hit(s): a cubin for sm_90" in first
    assert "axpy<float>    -> _Z4axpyIfEvT_PKS0_PS0_i" in first
    assert "would run: axpy<float> and axpy<double>" in first
    second = run_example("quickstart.py", cache_dir, "--arch", "sm_90")
    assert "100 requests, 0 compile(s), 99 joined, 1 disk hit(s)" in second
    assert "from the disk cache" in second


def test_viterbi_compiles_its_kernel_and_says_what_it_would_decode(cache_dir: Path) -> None:
    if has_gpu():
        pytest.skip("with a GPU the example decodes and checks against NumPy: test_gpu")
    out = run_example("viterbi.py", cache_dir, "--sequences", "100", "--steps", "7")
    assert (
        "max-plus kernel with argmax for sm_90: tropical_gemm_tiled<float, FastMaxPlus, true" in out
    )
    assert "would decode 100 sequences of 7 steps over 64 states (6 max-plus products)" in out


def test_viterbi_reference_agrees_with_brute_force() -> None:
    import itertools

    import numpy as np

    viterbi = example_module("viterbi")
    rng = np.random.default_rng(20261122)
    # float32 log probabilities, summed in float64: sums of a dozen float32 values of these
    # magnitudes are exact there, so both sides score paths identically and a tie is a real tie
    # (scores equal to the last bit), not a rounding accident of one side.
    start, trans, emit = (x.astype(np.float64) for x in viterbi.random_hmm(rng, 4, 3))
    obs = rng.integers(0, 3, size=(40, 6))
    paths = viterbi.viterbi_numpy(start, trans, emit, obs)
    unique = 0
    for q in range(len(obs)):

        def score(p: tuple[int, ...], q: int = q) -> float:
            total = start[p[0]] + emit[p[0], obs[q, 0]]
            return float(
                total + sum(trans[p[i - 1], p[i]] + emit[p[i], obs[q, i]] for i in range(1, 6))
            )

        scores = {p: score(p) for p in itertools.product(range(4), repeat=6)}
        best = max(scores.values())
        winners = [p for p, s in scores.items() if s == best]
        # Ties are handled: any path attaining the maximum is a correct decoding.
        assert tuple(int(s) for s in paths[q]) in winners, (q, winners)
        unique += len(winners) == 1
    assert unique >= 30  # most sequences have one best path, so the check has teeth


def test_warm_start_measures_a_cold_then_warm_restart(cache_dir: Path) -> None:
    out = run_example("warm_start.py", cache_dir, "--arch", "sm_90", "--semirings", "andor",
                      "--dtypes", "bool")  # fmt: skip
    lines = out.splitlines()
    assert lines[0].startswith("cold start: 8 kernels for sm_90 ready in")
    assert lines[0].endswith("(8 compiled, 0 from the disk cache)")
    assert lines[1].endswith("(0 compiled, 8 from the disk cache)")
    assert lines[2].endswith("(0 compiled, 8 from the disk cache)")
    assert "a warm cache makes the restart" in lines[3]
    assert "empty CUDA_CACHE_PATH" in lines[4]


def test_shortest_paths_server_compiles_and_says_what_it_would_serve(cache_dir: Path) -> None:
    if has_gpu():
        pytest.skip("with a GPU the server serves: test_gpu")
    out = run_example("shortest_paths_server.py", cache_dir, "--sizes", "64", "4096")
    assert "compiled 2 min-plus kernel(s) with argmax for sm_90" in out
    assert "would serve POST /shortest-paths and GET /stats on port 8080" in out


def test_shortest_paths_requests_are_validated() -> None:
    server = example_module("shortest_paths_server")
    parse, path = server.parse, server.path
    import numpy as np

    weights, pairs = parse(
        {"weights": [[0, 4, None], [None, 0, 1], [2, None, 0]], "pairs": [[0, 2]]}
    )
    assert weights.dtype == np.float32
    assert np.isinf(weights[0, 2])
    assert pairs == [(0, 2)]
    for body, message in (
        ([], 'a JSON object with "weights"'),
        ({"weights": [[0, 1]]}, "square list of lists"),
        ({"weights": [["x"]]}, "numbers or null"),
        ({"weights": [[-1]]}, "non-negative"),
        ({"weights": [[0]], "pairs": [[0, 1]]}, "below 1"),
    ):
        with pytest.raises(ValueError, match=message):
            parse(body)
    hop = np.array([[0, 1, 1], [-1, 1, 2], [0, 0, 2]])
    assert path(hop, 0, 2) == [0, 1, 2]
    assert path(hop, 1, 0) == []
    assert path(hop, 2, 2) == [2]
