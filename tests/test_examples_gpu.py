"""The examples on a GPU: Viterbi against NumPy, the shortest-path server under
concurrent requests against Floyd-Warshall."""

from __future__ import annotations

import itertools
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from .test_examples import ROOT, run_example

pytestmark = pytest.mark.gpu


def test_viterbi_paths_equal_numpys(cache_dir: Path) -> None:
    out = run_example("viterbi.py", cache_dir, "--sequences", "300", "--steps", "40")
    assert "100.0% of states equal to NumPy's Viterbi" in out


def floyd_warshall(weights: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    dist = weights.astype(np.float64)
    np.fill_diagonal(dist, 0)
    for k in range(len(dist)):
        dist = np.minimum(dist, dist[:, k : k + 1] + dist[k : k + 1, :])
    return dist


def test_the_server_answers_concurrent_queries_correctly(cache_dir: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, str(ROOT / "examples" / "shortest_paths_server.py"), "--port", str(port)],
        stdout=subprocess.PIPE, text=True,
        env={**os.environ, "AIONVRTC_CACHE_DIR": str(cache_dir)},
    )  # fmt: skip
    try:
        assert server.stdout is not None
        deadline = time.monotonic() + 120
        while "serving on" not in server.stdout.readline():
            assert time.monotonic() < deadline
            assert server.poll() is None

        def ask(seed: int) -> tuple[np.ndarray[Any, Any], list[Any], dict[str, Any]]:
            rng = np.random.default_rng(seed)
            n = int(rng.integers(2, 200))
            weights = rng.integers(1, 100, size=(n, n)).astype(float)
            weights[rng.random((n, n)) < 0.9] = np.inf  # sparse: long paths, some unreachable
            pairs = [[int(rng.integers(n)), int(rng.integers(n))] for _ in range(20)]
            body = {"weights": [[None if np.isinf(w) else w for w in row] for row in weights],
                    "pairs": pairs}  # fmt: skip
            request = urllib.request.Request(
                f"http://127.0.0.1:{port}/shortest-paths", data=json.dumps(body).encode(),
                headers={"Content-Type": "application/json"},
            )  # fmt: skip
            with urllib.request.urlopen(request, timeout=120) as response:
                return weights, pairs, json.loads(response.read())

        with ThreadPoolExecutor(32) as pool:
            answers = list(pool.map(ask, range(64)))
        for weights, pairs, answer in answers:
            want = floyd_warshall(weights)
            for (s, t), got, route in zip(pairs, answer["distances"], answer["paths"], strict=True):
                if np.isinf(want[s, t]):
                    assert got is None
                    assert route == []
                    continue
                assert got == pytest.approx(want[s, t])
                assert route[0] == s
                assert route[-1] == t
                cost = 0.0 if s == t else sum(weights[a, b] for a, b in itertools.pairwise(route))
                assert cost == pytest.approx(want[s, t])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/stats", timeout=10) as response:
            stats = json.loads(response.read())
        assert stats["compiles"] <= 2  # the warm-up's kernel, and at most one more shape class
        assert stats["requests"] > 64
    finally:
        server.terminate()
        server.wait(timeout=30)
