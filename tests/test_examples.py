"""The README's main example, as a newcomer runs it (without a GPU here: compile only)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from aionvrtc import tropical
from aionvrtc.tropical import problems

from .support import ROOT, has_gpu
from .support.examples import run_example


def example_module(name: str) -> Any:
    """examples/<name>.py imported as a module (its functions, without running main)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, ROOT / "examples" / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    # Registered first, as an import does: dataclasses look their module up while it runs.
    sys.modules[name] = module
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
    n = len(tropical.all_specs(["andor"], ["bool"]))  # 8 products, 12 counted, 6 k-best
    assert n == 26
    assert lines[0].startswith(f"cold start: {n} kernels for sm_90 ready in")
    assert lines[0].endswith(f"({n} compiled, 0 from the disk cache)")
    assert lines[1].endswith(f"(0 compiled, {n} from the disk cache)")
    assert lines[2].endswith(f"(0 compiled, {n} from the disk cache)")
    assert "a warm cache makes the restart" in lines[3]
    assert "empty CUDA_CACHE_PATH" in lines[4]


def test_shortest_paths_server_compiles_and_says_what_it_would_serve(cache_dir: Path) -> None:
    if has_gpu():
        pytest.skip("with a GPU the server serves: test_gpu")
    out = run_example("shortest_paths_server.py", cache_dir, "--sizes", "64", "4096")
    assert "compiled 2 min-plus kernel(s) with argmax and the hops' kernels for sm_90" in out
    assert "would serve POST /shortest-paths and GET /stats on port 8080" in out


def test_shortest_paths_json_requests_are_validated(monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    import numpy as np

    server = example_module("shortest_paths_server")
    parse, path = server.parse, server.path

    def ask(body: Any) -> Any:
        return parse("application/json", json.dumps(body).encode())

    weights, pairs = ask({"weights": [[0, 4, None], [None, 0, 1], [2, None, 0]], "pairs": [[0, 2]]})
    assert weights.dtype == np.float32
    assert np.isinf(weights[0, 2])
    assert weights[0, 1] == 4
    assert pairs == [(0, 2)]
    assert ask({"weights": [[0.5]]})[1] == []
    for body, message in (
        ([], 'a JSON object with "weights"'),
        ({"pairs": []}, 'a JSON object with "weights"'),
        ({"weights": 5}, "square list of lists"),
        ({"weights": [[0, 1], [1]]}, "square list of lists"),
        ({"weights": [[0, 1]]}, r"square \(n x n\), n from 1 to 4096"),
        ({"weights": []}, r"square \(n x n\)"),
        ({"weights": [["x"]]}, "numbers or null"),
        ({"weights": [["1"]]}, "numbers or null"),
        ({"weights": [[True]]}, "numbers or null"),
        ({"weights": [[-1]]}, "non-negative"),
        ({"weights": [[float("nan")]]}, "no NaN"),  # json.dumps writes NaN, json.loads reads it
        ({"weights": [[1e300]]}, "fit in float32"),
        ({"weights": [[10**400]]}, "fit in float32"),
        ({"weights": [[0]], "pairs": [[0, 1]]}, "nodes below 1"),
        ({"weights": [[0]], "pairs": [[-1, 0]]}, "nodes below 1"),
        ({"weights": [[0]], "pairs": [[0]]}, r"p x 2 integers"),
        ({"weights": [[0]], "pairs": [[0, 0], [0]]}, r"p x 2 integers"),
        ({"weights": [[0]], "pairs": [[0, 0.0]]}, r"p x 2 integers"),
        ({"weights": [[0]], "pairs": [[True, 0]]}, r"p x 2 integers"),
        ({"weights": [[0]], "pairs": {"0": 0}}, r"p x 2 integers"),
    ):
        with pytest.raises(ValueError, match=message):
            ask(body)
    for raw in (b"{", b"\xff\xfe", b""):
        with pytest.raises(ValueError, match="the body is not JSON"):
            parse("application/json", raw)
    monkeypatch.setattr(server, "MAX_NODES", 2)
    with pytest.raises(ValueError, match="n from 1 to 2"):
        ask({"weights": [[0] * 3] * 3})
    monkeypatch.setattr(server, "MAX_PAIRS", 2)
    assert ask({"weights": [[0]], "pairs": [[0, 0]] * 2})[1] == [(0, 0), (0, 0)]
    with pytest.raises(ValueError, match='"pairs" holds 3 pairs: at most 2 a request'):
        ask({"weights": [[0]], "pairs": [[0, 0]] * 3})
    hop = np.array([[0, 1, 1], [-1, 1, 2], [0, 0, 2]])  # (each node's first hop, by target)
    assert path(hop[:, 2], 0, 2) == [0, 1, 2]
    assert path(hop[:, 0], 1, 0) == []
    assert path(hop[:, 2], 2, 2) == [2]


def npz(**arrays: Any) -> bytes:
    import io

    import numpy as np

    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def test_shortest_paths_npz_requests_are_validated(monkeypatch: pytest.MonkeyPatch) -> None:
    import io
    import json
    import zipfile

    import numpy as np

    server = example_module("shortest_paths_server")
    parse = server.parse
    inf = np.inf
    w = np.array([[0, 4, inf], [inf, 0, 1], [2, inf, 0]])
    for content_type in ("application/x-npz", "application/octet-stream"):
        weights, pairs = parse(content_type, npz(weights=w, pairs=np.array([[0, 2], [2, 1]])))
        assert weights.dtype == np.float32
        assert weights.flags.c_contiguous
        assert np.array_equal(weights, w.astype(np.float32))
        assert pairs == [(0, 2), (2, 1)]
    # The same graph as JSON gives the same query; without pairs, none; any layout, C order.
    as_json = {"weights": [[None if np.isinf(x) else x for x in row] for row in w.tolist()],
               "pairs": [[0, 2], [2, 1]]}  # fmt: skip
    weights_j, pairs_j = parse("application/json", json.dumps(as_json).encode())
    assert np.array_equal(weights_j, weights)
    assert pairs_j == pairs
    weights, pairs = parse("application/x-npz", npz(weights=np.asfortranarray(w, np.float32)))
    assert np.array_equal(weights, w.astype(np.float32))
    assert weights.flags.c_contiguous
    assert pairs == []
    assert parse("application/x-npz", npz(weights=w, pairs=np.zeros((0, 2), np.uint8)))[1] == []
    npy = io.BytesIO()
    np.save(npy, w)
    not_npy = io.BytesIO()
    with zipfile.ZipFile(not_npy, "w") as archive:
        archive.writestr("weights.npy", b"not an array")
    pair = np.array([[0, 1]])
    for body, message in (
        (b"", r"np.savez bytes holding \"weights\" \(and \"pairs\"\): not readable \(EOFError\)"),
        (b"not an npz", r"not readable \(ValueError\)"),
        (b"PK\x03\x04 truncated", r"not readable \(BadZipFile\)"),
        (npz(weights=w)[:100], r"not readable \(BadZipFile\)"),
        (
            npy.getvalue(),
            r'^an .npz body must be np.savez bytes holding "weights" \(and "pairs"\)$',
        ),
        (npz(w=w), r'holding "weights" \(and "pairs"\)$'),
        (npz(weights=np.array([[0, "x"]], object)), "Object arrays cannot be loaded"),
        (not_npy.getvalue(), r"must be square \(n x n\)"),
        (npz(weights=np.zeros((2, 3))), r"square \(n x n\), n from 1 to 4096"),
        (npz(weights=np.zeros(4)), r"square \(n x n\)"),
        (npz(weights=np.zeros((0, 0))), r"square \(n x n\)"),
        (npz(weights=np.zeros((2, 2, 2))), r"square \(n x n\)"),
        (npz(weights=np.zeros((2, 2), np.int64)), "must be float32 or float64, not int64"),
        (npz(weights=np.zeros((2, 2), np.float16)), "must be float32 or float64, not float16"),
        (npz(weights=np.array([["0"]])), "must be float32 or float64, not <U1"),
        (npz(weights=np.array([[0, -1.0], [1, 0]])), "non-negative"),
        (npz(weights=np.array([[0, -inf], [1, 0]])), "non-negative"),
        (npz(weights=np.array([[0, np.nan], [1, 0]])), "no NaN"),
        (npz(weights=np.array([[0, 1e39], [1, 0]])), "fit in float32"),
        (npz(weights=w, pairs=np.array([[0, 3]])), r"\(p x 2 integers\) of nodes below 3"),
        (npz(weights=w, pairs=np.array([[-1, 0]])), "nodes below 3"),
        (npz(weights=w, pairs=np.array([[0.0, 1.0]])), r"p x 2 integers"),
        (npz(weights=w, pairs=np.array([[True, False]])), r"p x 2 integers"),
        (npz(weights=w, pairs=np.array([0, 1])), r"p x 2 integers"),
        (npz(weights=w, pairs=np.array([[0, 1, 2]])), r"p x 2 integers"),
        (npz(weights=w, pairs=np.zeros(0, np.int64)), r"p x 2 integers"),
        (npz(weights=w, pairs=pair.astype(object)), "Object arrays cannot be loaded"),
    ):
        with pytest.raises(ValueError, match=message):
            parse("application/x-npz", body)
    # The bytes a member expands to are bounded before it is read (a small zip can expand far).
    monkeypatch.setattr(server, "MAX_BODY", 1 << 20)
    big = npz(weights=np.zeros((400, 400)))
    assert len(big) > 1 << 20
    with pytest.raises(ValueError, match="expands to more than 1 MiB"):
        parse("application/x-npz", big)
    assert parse("application/x-npz", npz(weights=np.zeros((300, 300))))[0].shape == (300, 300)


def test_shortest_paths_server_timing_header_and_bad_bodies_over_http() -> None:
    import asyncio

    from aiohttp.test_utils import TestClient, TestServer

    server = example_module("shortest_paths_server")
    assert server.server_timing(parse=0.0001234, gpu=0.0034, respond=0.0002) == {
        "Server-Timing": "parse;dur=0.123, gpu;dur=3.400, respond;dur=0.200"
    }

    async def main() -> None:
        # No compiler and no GPU are needed to turn bad bodies away.
        async with TestClient(TestServer(server.make_app(None))) as client:
            for content_type, body, message in (
                ("application/json", b"[]", 'a JSON object with "weights"'),
                ("application/x-npz", b"[]", "not readable (ValueError)"),
                ("application/octet-stream", npz(weights=[[-1.0]]), "non-negative"),
                ("text/plain", npz(weights=[[1.0]]), "the body is not JSON"),
            ):
                response = await client.post(
                    "/shortest-paths", data=body, headers={"Content-Type": content_type}
                )
                assert response.status == 400
                assert message in (await response.json())["error"]
                name, duration = response.headers["Server-Timing"].split(";dur=")
                assert name == "parse"
                assert 0 <= float(duration) < 1000

    asyncio.run(main())


def test_tensor_network_plans_compiles_and_says_what_it_would_run(
    cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if has_gpu():
        pytest.skip("with a GPU the example contracts, checks and times the networks")
    # opt_einsum breaks ties in set order: a fixed string hash makes its plans the same from run
    # to run (cotengra's, seeded, and the king's graphs' explicit paths are anyway).
    monkeypatch.setenv("PYTHONHASHSEED", "0")
    out = run_example(
        "tensor_network.py", cache_dir, "--regular", "20", "60", "--kings", "4", "10",
        "--spin-glass", "20", "--kings-subgraph", "8", "--square-spin-glass", "6",
        "--planner", "random-greedy", "--trials", "8", "--memory-limit", "1024",
    )  # fmt: skip
    lines = out.splitlines()
    assert lines[0].startswith(
        "MIS of the random 3-regular graph (20 vertices, 30 edges), opt_einsum random-greedy, "
        "8 trials ("
    )
    # 1,024 bytes are 2^8 float32s: the 60-vertex graph's 2^9 run in slices of 2^8 or less.
    regular60 = next(x for x in lines if x.startswith("MIS of the random 3-regular graph (60"))
    assert "(60 vertices, 90 edges)" in regular60
    assert "; in " in regular60
    assert " slices over " in regular60
    assert regular60.split("space complexity ")[1].split()[0] in ("7", "8")
    # Row by row, a king's graph of side L leaves at most L + 1 vertices open: 2^(L+1).
    king4 = next(x for x in lines if x.startswith("MIS of the 4x4 king's graph"))
    assert "(16 vertices, 42 edges), row by row (" in king4
    assert "): 57 steps, largest intermediate 2^5 (32) elements" in king4
    assert "slices" not in king4
    king10 = next(x for x in lines if x.startswith("MIS of the 10x10 king's graph"))
    assert "(100 vertices, 342 edges)" in king10
    assert "): 441 steps, largest intermediate 2^11 (2,048) elements" in king10
    assert "space complexity 8 a slice" in king10
    # 0.8 of the 8 x 8 grid's 64 sites: 51 vertices.
    assert "MIS of the 8x8 king's subgraph at filling 0.8 (51 vertices, " in out
    assert "spin glass of the random 3-regular graph (20 vertices, 30 edges)" in out
    assert "spin glass of the 6x6 square lattice (36 vertices, 60 edges)" in out
    compiled = lines.index(next(x for x in lines if x.startswith("compiled ")))
    assert lines[compiled].endswith(" kernel(s) for sm_90:")
    kernels = lines[compiled + 1 : -1]
    assert len(kernels) == int(lines[compiled].split()[1]) >= 4
    assert all(k.startswith(("  tropical_gemm", "  tropical_many", "  einsum_")) for k in kernels)
    assert all(k.endswith("(cubin)") for k in kernels)
    # The products', the copy's (king's graphs copy), the small products' (a short sum that
    # would copy reads its operands in place) and the backtrace's (argmax=True).
    assert any(k.startswith("  tropical_many<float, MaxPlus, true>") for k in kernels)
    assert "  einsum_backtrace<float, MaxPlus> (cubin)" in kernels
    assert "  einsum_backtrace<float, MinPlus> (cubin)" in kernels
    assert any(k.startswith("  einsum_copy<") for k in kernels)
    # Max-plus for the sets, min-plus for the spin glass, each with and without argmax.
    assert any("MaxPlus, true" in k for k in kernels)
    assert any("MinPlus, true" in k for k in kernels)
    assert any("MinPlus, false" in k for k in kernels)
    assert lines[-1] == (
        "no usable GPU for sm_90 here (NoDeviceError): would contract 7 network(s) (2 in "
        "slices) with their assignments, check 3 against brute force, 2 against NumPy along "
        "the same order and 2 against another order or slicing, and time each over 5 runs, against "
        "torch-semiring-einsum where it is installed"
    )


def test_tensor_network_keeps_its_paths(cache_dir: Path, tmp_path: Path) -> None:
    if has_gpu():
        pytest.skip("with a GPU the example contracts, checks and times the networks")
    paths = tmp_path / "paths.json"
    flags = ["--regular", "30", "--kings", "4", "--spin-glass", "--square-spin-glass", "5",
             "--planner", "rows", "--paths", str(paths)]  # fmt: skip
    first = run_example("tensor_network.py", cache_dir, *flags).splitlines()
    assert first[0].startswith("MIS of the random 3-regular graph (30 vertices, 45 edges), auto (")
    kept = json.loads(paths.read_text())
    assert len(paths.read_text().splitlines()) == 2 + 3  # braces, a network a line
    assert [entry["network"] for entry in kept.values()] == [
        "MIS of the random 3-regular graph (30 vertices, 45 edges)",
        "MIS of the 4x4 king's graph (16 vertices, 42 edges)",
        "spin glass of the 5x5 square lattice (25 vertices, 40 edges)",
    ]
    assert [entry["planner"] for entry in kept.values()] == ["auto", "row by row", "row by row"]
    assert [len(entry["path"]) for entry in kept.values()] == [74, 57, 39]  # steps: operands - 1
    assert not (tmp_path / "paths.json.new").exists()
    # Changed on disk, a path is used as it stands: the second run plans none of them again.
    key = next(iter(kept))
    kept[key]["path"] = [[0, 1]] * len(kept[key]["path"])  # operands in the order given
    paths.write_text(json.dumps(kept))
    second = run_example("tensor_network.py", cache_dir, *flags).splitlines()
    read = [x for x in second if f"(path read from {paths})" in x]
    assert len(read) == 3
    assert read[0].startswith("MIS of the random 3-regular graph (30 vertices, 45 edges), auto (")
    assert json.loads(paths.read_text())[key]["path"] == kept[key]["path"]


def test_tensor_network_graphs_are_simple_regular_and_seeded() -> None:
    import numpy as np

    tn = example_module("tensor_network")
    for n in (4, 10, 20, 100, 200):
        edges = tn.random_regular_graph(n, 3, np.random.default_rng([7, n]))
        assert len(edges) == 3 * n // 2
        assert all(0 <= u < v < n for u, v in edges)  # no loops, each edge once as u < v
        assert len(set(edges)) == len(edges)  # no multi-edges
        assert np.bincount(np.array(edges).ravel(), minlength=n).tolist() == [3] * n
        assert edges == tn.random_regular_graph(n, 3, np.random.default_rng([7, n]))
        if n >= 10:
            assert edges != tn.random_regular_graph(n, 3, np.random.default_rng([8, n]))
    assert len(tn.random_regular_graph(12, 4, np.random.default_rng(1))) == 24
    for n, degree in ((5, 3), (3, 3)):
        with pytest.raises(ValueError, match="no simple"):
            tn.random_regular_graph(n, degree, np.random.default_rng(1))
    # The king's graph: 3 neighbours at a corner, 5 along a side, 8 inside.
    kings = tn.kings_graph(4)
    assert len(kings) == 2 * 4 * 3 + 2 * 3 * 3 == 42
    degrees = np.bincount(np.array(kings).ravel(), minlength=16).reshape(4, 4)
    assert degrees.tolist() == [[3, 5, 5, 3], [5, 8, 8, 5], [5, 8, 8, 5], [3, 5, 5, 3]]
    assert (0, 5) in kings
    assert (3, 6) in kings
    assert (0, 2) not in kings


def test_tensor_network_kings_subgraphs_and_square_lattices() -> None:
    import numpy as np

    from aionvrtc import tropical

    tn = example_module("tensor_network")
    n, edges = tn.kings_subgraph(10, 0.8, np.random.default_rng(5))
    assert n == 80
    again = tn.kings_subgraph(10, 0.8, np.random.default_rng(5))
    assert again == (n, edges)
    assert tn.kings_subgraph(10, 0.8, np.random.default_rng(6)) != (n, edges)
    # The kept sites in row order: an edge joins kept neighbours of the full grid, and every
    # pair of kept neighbours is joined.
    sites = np.sort(np.random.default_rng(5).choice(100, size=80, replace=False))
    full = set(tn.kings_graph(10))
    assert set(edges) == {
        (i, j) for i in range(n) for j in range(i + 1, n) if (sites[i], sites[j]) in full
    }
    assert tn.kings_subgraph(4, 1.0, np.random.default_rng(1)) == (16, tn.kings_graph(4))
    for bad in (0.0, 1.5):
        with pytest.raises(ValueError, match="filling must be in"):
            tn.kings_subgraph(4, bad, np.random.default_rng(1))
    square = tn.square_lattice(4)
    assert len(square) == 2 * 4 * 3 == 24
    degrees = np.bincount(np.array(square).ravel(), minlength=16).reshape(4, 4)
    assert degrees.tolist() == [[2, 3, 3, 2], [3, 4, 4, 3], [3, 4, 4, 3], [2, 3, 3, 2]]
    assert {(0, 1), (0, 4)} <= set(square)
    assert (0, 5) not in square
    # Both contract to brute force's answer (NumPy reference along the default order).
    n, edges = tn.kings_subgraph(5, 0.8, np.random.default_rng(3))
    mis = problems.independent_set(edges, vertices=range(n))
    assert tropical.reference.einsum(mis.subscripts, *mis.operands) == tn.brute_force_mis(n, edges)
    couplings = tn.spin_glass_couplings(square, np.random.default_rng(4))
    glass = problems.spin_glass(square, couplings, vertices=range(16))
    got = tropical.reference.einsum(glass.subscripts, *glass.operands, semiring="minplus")
    assert got == tn.brute_force_ground_energy(16, square, couplings)


def _known_cubic_graphs() -> dict[str, tuple[int, list[tuple[int, int]], int]]:
    """Name: (vertices, edges, the size of a maximum independent set)."""
    cube = [(u, u ^ b) for u in range(8) for b in (1, 2, 4) if u < u ^ b]
    outer = [(i, (i + 1) % 5) for i in range(5)]
    petersen = outer + [(i, i + 5) for i in range(5)] + [(5 + i, 5 + (i + 2) % 5) for i in range(5)]
    k4 = [(u, v) for u in range(4) for v in range(u + 1, 4)]
    return {"K4": (4, k4, 1), "cube": (8, cube, 4), "Petersen": (10, petersen, 4)}


def test_tensor_network_mis_contraction_agrees_with_brute_force() -> None:
    import numpy as np

    from aionvrtc import tropical

    tn = example_module("tensor_network")
    graphs: list[tuple[int, list[tuple[int, int]], int | None]] = list(
        _known_cubic_graphs().values()
    )
    for n in (4, 6, 8, 10, 12, 14):
        for seed in (1, 2):
            graphs.append(
                (n, tn.random_regular_graph(n, 3, np.random.default_rng([seed, n])), None)
            )
    for side in (2, 3, 4):
        graphs.append((side * side, tn.kings_graph(side), ((side + 1) // 2) ** 2))
    values = []
    for n, edges, known in graphs:
        want = tn.brute_force_mis(n, edges)
        if known is not None:
            assert want == known, (n, edges)
        mis = problems.independent_set(edges, vertices=range(n))
        subscripts, operands = mis.subscripts, list(mis.operands)
        assert subscripts.endswith("->")
        assert all(x.dtype == np.float32 for x in operands)
        got = tropical.reference.einsum(subscripts, *operands, semiring="maxplus")
        assert got.shape == ()
        assert float(got) == want, (n, edges)
        plan = tropical.einsum_plan(subscripts, *operands, optimize="greedy")
        along = tropical.reference.einsum(subscripts, *operands, semiring="maxplus", path=plan.path)
        assert float(along) == want, (n, edges)
        values.append(want)
    assert len(set(values)) >= 4  # the graphs differ in what they hold
    # The king's grid row by row (an explicit path), and its largest intermediate 2^(side+1).
    mis = problems.independent_set(tn.kings_graph(5), vertices=range(25))
    subscripts, operands = mis.subscripts, list(mis.operands)
    order = [tn.symbol(v) for v in range(25)]
    path = tn.elimination_path(subscripts[:-2].split(","), order)
    plan = tropical.einsum_plan(subscripts, *operands, optimize=path)
    assert plan.largest_intermediate == 2**6
    assert float(tropical.reference.einsum(subscripts, *operands, path=plan.path)) == 9


def test_tensor_network_spin_glass_contraction_agrees_with_brute_force() -> None:
    import numpy as np

    from aionvrtc import tropical

    tn = example_module("tensor_network")
    # K4: antiferromagnetic (J = +1) at best -2 (two up, two down), ferromagnetic (J = -1) -6.
    _, k4, _ = _known_cubic_graphs()["K4"]
    assert tn.brute_force_ground_energy(4, k4, [1] * 6) == -2
    assert tn.brute_force_ground_energy(4, k4, [-1] * 6) == -6
    assert problems.spin_glass(k4, [1] * 6).value([1, 1, 0, 0]) == -2
    cases = [(4, k4, [1] * 6), (4, k4, [-1] * 6)]
    for n in (6, 8, 10, 12, 14):
        for seed in (1, 2, 3):
            rng = np.random.default_rng([seed, n])
            edges = tn.random_regular_graph(n, 3, rng)
            couplings = tn.spin_glass_couplings(edges, rng)
            assert set(couplings) <= {-1, 1}
            cases.append((n, edges, couplings))
    energies = []
    for n, edges, couplings in cases:
        want = tn.brute_force_ground_energy(n, edges, couplings)
        glass = problems.spin_glass(edges, couplings, vertices=range(n))
        subscripts, operands = glass.subscripts, glass.operands
        got = tropical.reference.einsum(subscripts, *operands, semiring="minplus")
        assert float(got) == want, (n, edges, couplings)
        plan = tropical.einsum_plan(subscripts, *operands, optimize="greedy")
        along = tropical.reference.einsum(subscripts, *operands, semiring="minplus", path=plan.path)
        assert float(along) == want
        # Frustration: a ground state leaves some edges unsatisfied, above -|E| in most cases.
        assert -len(edges) <= want < 0
        energies.append(want + len(edges))
    assert len(set(energies)) >= 3
    assert sum(e > 0 for e in energies) >= len(energies) // 2


def test_tensor_network_assignment_checks_catch_wrong_assignments() -> None:
    tn = example_module("tensor_network")
    n, edges, _ = _known_cubic_graphs()["cube"]
    mis = problems.independent_set(edges, vertices=range(n))
    net = tn.Network("MIS", "cube", mis, "greedy", "greedy")
    chosen = {tn.symbol(v): int(bin(v).count("1") % 2 == 0) for v in range(n)}  # even weight
    assert mis.selected(chosen) == [0, 3, 5, 6]
    assert tn.check(net, 4.0, chosen) == "an independent set of 4 vertices"
    with pytest.raises(SystemExit, match="attains 4, not 5"):
        tn.check(net, 5.0, chosen)
    chosen[tn.symbol(1)] = 1
    with pytest.raises(SystemExit, match="not independent"):
        tn.check(net, 5.0, chosen)
    # Bipartite, so all antiferromagnetic bonds are satisfied by the two colours: -12.
    glass = problems.spin_glass(edges, [1] * len(edges), vertices=range(n))
    colours = {tn.symbol(v): bin(v).count("1") % 2 for v in range(n)}
    assert glass.value(colours) == -12
    assert tn.check(tn.Network("spin glass", "cube", glass, "greedy", "greedy"), -12.0, colours)
    assert tn.brute_force_ground_energy(n, edges, [1] * len(edges)) == -12
