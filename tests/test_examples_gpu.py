"""The examples on a GPU: Viterbi against NumPy, the shortest-path server under
concurrent requests (JSON and .npz bodies, batched and not) against Floyd-Warshall."""

from __future__ import annotations

import contextlib
import io
import itertools
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from .support import ROOT
from .support.examples import run_example

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


@contextlib.contextmanager
def serving(cache_dir: Path, *args: str) -> Iterator[int]:
    """examples/shortest_paths_server.py running with ``args``; yields its port."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, str(ROOT / "examples" / "shortest_paths_server.py"), "--port", str(port),
         *args],
        stdout=subprocess.PIPE, text=True,
        env={**os.environ, "AIONVRTC_CACHE_DIR": str(cache_dir)},
    )  # fmt: skip
    try:
        assert server.stdout is not None
        deadline = time.monotonic() + 120
        while "serving on" not in server.stdout.readline():
            assert time.monotonic() < deadline
            assert server.poll() is None
        yield port
    finally:
        server.terminate()
        server.wait(timeout=30)


def check_answer(weights: np.ndarray[Any, Any], pairs: list[Any], answer: dict[str, Any]) -> None:
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


def stats(port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/stats", timeout=10) as response:
        return json.loads(response.read())  # type: ignore[no-any-return]


def test_the_server_answers_concurrent_queries_correctly(cache_dir: Path) -> None:
    with serving(cache_dir) as port:

        def ask(seed: int) -> tuple[np.ndarray[Any, Any], list[Any], dict[str, Any]]:
            rng = np.random.default_rng(seed)
            n = int(rng.integers(1, 200))
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
            check_answer(weights, pairs, answer)
        counts = stats(port)
        assert counts["compiles"] <= 3  # the warm-up's kernels (two tiles, the hops'), none more
        assert counts["requests"] > 64
        assert counts["solved"]["requests"] == 64
        assert 1 <= counts["solved"]["groups"] <= 64


def post_npz(
    port: int, weights: np.ndarray[Any, Any], pairs: np.ndarray[Any, Any]
) -> tuple[dict[str, Any], str]:
    """The server's answer to a query sent as an .npz body, and its Server-Timing header."""
    body = io.BytesIO()
    np.savez(body, weights=weights, pairs=pairs)
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/shortest-paths", data=body.getvalue(),
        headers={"Content-Type": "application/x-npz"},
    )  # fmt: skip
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.loads(response.read()), response.headers["Server-Timing"]


def test_the_server_answers_two_sizes_at_once_under_load(cache_dir: Path) -> None:
    """Groups of two sizes on the GPU at once, each on a stream of its own, large enough that
    their squarings overlap (memory one group frees must not go to another while its kernels
    still read it): every answer checked."""
    with serving(cache_dir, "--sizes", "300", "500") as port:

        def ask(seed: int) -> tuple[np.ndarray[Any, Any], list[Any], dict[str, Any]]:
            rng = np.random.default_rng(seed)
            n = (300, 500)[seed % 2]
            weights = rng.integers(0, 50, size=(n, n)).astype(np.float32)
            weights[rng.random((n, n)) < 0.99] = np.inf  # long paths: several squarings
            pairs = rng.integers(0, n, size=(10, 2))
            answer, _ = post_npz(port, weights, pairs)
            return weights, pairs.tolist(), answer

        with ThreadPoolExecutor(24) as pool:
            answers = list(pool.map(ask, range(96)))
        for weights, pairs, answer in answers:
            check_answer(weights, pairs, answer)
            assert answer["n"] == len(weights)
        counts = stats(port)
        assert counts["solved"]["requests"] == 96
        assert counts["solved"]["groups"] < 96


@pytest.mark.parametrize("batch", [True, False], ids=["batch", "no-batch"])
def test_the_server_answers_npz_bodies_and_says_where_the_time_went(
    cache_dir: Path, batch: bool
) -> None:
    with serving(cache_dir, "--sizes", "96", *([] if batch else ["--no-batch"])) as port:

        def ask(seed: int) -> tuple[np.ndarray[Any, Any], list[Any], dict[str, Any], str]:
            rng = np.random.default_rng(seed)
            n = 96  # one size: concurrent requests can be solved together
            # Weights 0 to 2: ties everywhere, and ways of zero weight both ways (a path once
            # looped between two nodes that each named the other as the first hop).
            weights = rng.integers(0, 3, size=(n, n)).astype(np.float64)
            weights[rng.random((n, n)) < 0.9] = np.inf
            pairs = rng.integers(0, n, size=(int(rng.integers(0, 21)), 2))  # none, at times
            answer, timing = post_npz(port, weights, pairs)
            return weights, pairs.tolist(), answer, timing

        with ThreadPoolExecutor(32) as pool:
            answers = list(pool.map(ask, range(128)))
        for weights, pairs, answer, timing in answers:
            check_answer(weights, pairs, answer)
            fields = dict(field.split(";dur=") for field in timing.split(", "))
            assert list(fields) == ["parse", "gpu", "respond"]
            assert all(0 <= float(ms) < 60_000 for ms in fields.values())
        counts = stats(port)
        assert counts["compiles"] <= 2  # (the hops' kernels and one tile)
        assert counts["solved"]["requests"] == 128
        if batch:  # 32 clients at once: requests solved together
            assert counts["solved"]["groups"] < 128
        else:
            assert counts["solved"]["groups"] == 128
