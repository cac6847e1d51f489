"""Maximum independent sets and spin-glass ground states as tropical tensor networks contracted
on the GPU, checked against brute force and NumPy, and timed against torch-semiring-einsum.

    python examples/tensor_network.py [--regular 20 100 150 200] [--kings 4 10 15 20]
        [--kings-subgraph 38] [--filling 0.8] [--spin-glass 20 100 150]
        [--square-spin-glass 32]
        [--planner auto|hyper|hyper-roofline|cotengra|random-greedy|rows]
        [--plan-time 60] [--trials 256] [--memory-limit 4294967296] [--paths paths.json]
        [--repeats 5] [--json results.json] [--seed 2026] [--arch sm_90]

The published problems, one H100's worth:

    python examples/tensor_network.py --regular 200 220 --kings --spin-glass \
        --kings-subgraph 38 --planner hyper --plan-time 20

A graph becomes a tensor network with one index x_v in {0, 1} per vertex, built by
``tropical.problems``. For the maximum independent set (MIS), each vertex carries the vector
[0, 1] (v counts 1 when it is in the set) and each edge the matrix [[0, 0], [0, -inf]] (both
ends in the set is forbidden); contracted to a scalar in the max-plus semiring, the network
gives the maximum over all x of the sum of the entries: the size of a maximum independent set.
For an Ising spin glass with couplings J_uv = +-1 on the edges, each edge carries
J_uv s_u s_v over s = 2x - 1 in {-1, +1}, and the min-plus contraction is the ground-state
energy. With ``argmax=True`` the einsum also traces back a value of every index that attains
the result: a maximum independent set, a ground state, which the problem reads back and scores
from the graph again.

The contraction order sets the cost: its largest intermediate is 2^w elements for an order of
width w. A king's graph is contracted row by row through an explicit path (width side + 1), the
other graphs along --planner's order (see ``planner``). A network whose largest intermediate
holds more than --memory-limit bytes runs in slices (``memory_limit=``), and on every GPU of the
host as well as on one. --paths keeps each network's contraction path in a JSON file: a network
found there takes its path, whatever --planner says, and is not searched again (the
HyperOptimizer's orders change from run to run); every network's path is written back.

Graphs of at most 20 vertices are checked against brute force over all 2^n assignments, larger
ones against the NumPy reference (tropical.reference.einsum) along the same order where it is
unsliced and small enough, else against the GPU's contraction along another order in other
slices (for a network in slices, its order in smaller slices); every assignment is checked to
attain the value (where einsum refuses one, its argmaxes being past the device's memory, the
value alone is contracted). Then the contraction is timed on the GPU (median of --repeats runs
after a warm-up), NumPy once, and torch-semiring-einsum, when it and a CUDA PyTorch are
installed, along the same order. Planning time (the order's search and the slicing) is
reported apart. Without a GPU the example plans every network, compiles the kernels the plans
launch for ``--arch`` (default ``$AIONVRTC_ARCH``, else sm_90) and says what it would run.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import math
import statistics
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import anyio
import numpy as np
import opt_einsum

from aionvrtc import Compiler, KernelSpec, ModuleLoadError, NoDeviceError, resolve_target, tropical
from aionvrtc.tropical import problems

Edge = tuple[int, int]
Array = np.ndarray[Any, Any]

# Brute force enumerates all 2^n assignments up to this many vertices.
BRUTE_FORCE_VERTICES = 20


def symbol(v: int) -> str:
    """The index of vertex ``v``: a-z, A-Z, then non-ASCII characters (as opt_einsum names them)."""
    return str(opt_einsum.get_symbol(v))


def random_regular_graph(n: int, degree: int, rng: np.random.Generator) -> list[Edge]:
    """A uniformly random simple ``degree``-regular graph on vertices 0..n-1, as sorted (u, v)
    pairs with u < v: the pairing (configuration) model, which matches the n * degree stubs at
    random and starts over when the pairing has a loop or a repeated edge (for degree 3 about
    one pairing in e^2 = 7.4 is simple)."""
    if n * degree % 2 or not 0 <= degree < n:
        raise ValueError(f"no simple {degree}-regular graph has {n} vertices")
    for _ in range(10_000):
        pairs = rng.permutation(np.repeat(np.arange(n), degree)).reshape(-1, 2)
        low, high = pairs.min(axis=1), pairs.max(axis=1)
        if (low == high).any():
            continue
        edges = sorted(set(zip(low.tolist(), high.tolist(), strict=True)))
        if len(edges) == len(pairs):
            return edges
    raise RuntimeError(f"no simple {degree}-regular pairing of {n} vertices in 10,000 tries")


def kings_graph(side: int) -> list[Edge]:
    """The side x side king's graph: vertex r * side + c, joined to its 8 neighbours."""
    edges = []
    for r in range(side):
        for c in range(side):
            for dr, dc in ((0, 1), (1, -1), (1, 0), (1, 1)):
                if r + dr < side and 0 <= c + dc < side:
                    edges.append((r * side + c, (r + dr) * side + c + dc))
    return sorted(edges)


def kings_subgraph(side: int, filling: float, rng: np.random.Generator) -> tuple[int, list[Edge]]:
    """A king's subgraph, as GenericTensorNetworks' ``random_diagonal_coupled_graph`` makes them
    for its published benchmarks: here exactly round(filling * side^2) sites of the side x side
    grid drawn at random, joined as in the king's graph, and numbered 0..n-1 in row order.
    Returns (n, edges)."""
    if not 0 < filling <= 1:
        raise ValueError(f"filling must be in (0, 1], got {filling}")
    sites = np.sort(rng.choice(side * side, size=round(filling * side * side), replace=False))
    number = {int(site): v for v, site in enumerate(sites)}
    edges = [(number[u], number[v]) for u, v in kings_graph(side) if u in number and v in number]
    return len(sites), edges


def square_lattice(side: int) -> list[Edge]:
    """The side x side square lattice with open boundaries: vertex r * side + c, joined to its
    right and lower neighbours."""
    edges = []
    for r in range(side):
        for c in range(side):
            if c + 1 < side:
                edges.append((r * side + c, r * side + c + 1))
            if r + 1 < side:
                edges.append((r * side + c, (r + 1) * side + c))
    return edges


def spin_glass_couplings(edges: Sequence[Edge], rng: np.random.Generator) -> list[int]:
    """A coupling J_uv of -1 or +1 per edge, each equally likely."""
    return [int(j) for j in rng.choice(np.array([-1, 1]), size=len(edges))]


def _assignments(n: int) -> Array:
    if n > 24:
        raise ValueError(f"brute force over 2^{n} assignments is too much")
    return np.arange(1 << n, dtype=np.int64)  # bit v of each is x_v


def brute_force_mis(n: int, edges: Sequence[Edge]) -> int:
    """The size of a maximum independent set, by trying every subset of the n vertices."""
    x = _assignments(n)
    allowed = np.ones(len(x), bool)
    for u, v in edges:
        allowed &= ((x >> u) & (x >> v) & 1) == 0
    return int(np.bitwise_count(x[allowed]).max())


def brute_force_ground_energy(n: int, edges: Sequence[Edge], couplings: Sequence[int]) -> int:
    """The least energy over all 2^n spin configurations."""
    x = _assignments(n)
    energy = np.zeros(len(x), np.int64)
    for (u, v), j in zip(edges, couplings, strict=True):
        aligned = ((x >> u) ^ (x >> v)) & 1 == 0  # s_u s_v = +1
        energy += np.where(aligned, j, -j)
    return int(energy.min())


def elimination_path(inputs: Sequence[str], order: Iterable[str]) -> list[tuple[int, int]]:
    """A contraction path (opt_einsum's format) that sums the indices one at a time, in
    ``order``: the tensors holding an index are contracted pairwise, smallest first, the last
    product summing it. For indices of size 2 its largest intermediate is about 2^w elements,
    w being the width of the order: the most indices left joined by the sum of one index."""
    live = [frozenset(t) for t in inputs]
    path: list[tuple[int, int]] = []

    def contract(i: int, j: int) -> None:
        rest = [t for k, t in enumerate(live) if k not in (i, j)]
        needed = frozenset().union(*rest)  # a scalar result: what no other tensor has is summed
        live[:] = [*rest, (live[i] | live[j]) & needed]
        path.append((i, j))

    for index in order:
        while len(holders := sorted((len(t), k) for k, t in enumerate(live) if index in t)) > 1:
            (_, i), (_, j) = holders[:2]
            contract(min(i, j), max(i, j))
    while len(live) > 1:
        contract(0, 1)
    return path


@dataclass
class Network:
    """One problem instance: its graph, tensor network and contraction order."""

    problem: str  # "MIS" or "spin glass"
    graph: str
    built: problems.Problem  # the network, and the way back from an assignment
    optimize: Any  # a strategy name, an optimizer or an explicit path
    planner: str
    path_from: str | None = None  # the --paths file its path was read from
    known: int | None = None  # the value, where a formula gives it
    second: Any = None  # another order for the check, where one is known to be as good
    plan: tropical.EinsumPlan | None = None
    planning_s: float = 0.0
    row: dict[str, Any] = field(default_factory=dict)

    @property
    def n(self) -> int:
        return len(self.built.vertices)

    @property
    def edges(self) -> list[Edge]:
        return cast(list[Edge], list(self.built.edges))  # the example's vertices are 0..n-1

    @property
    def subscripts(self) -> str:
        return self.built.subscripts

    @property
    def operands(self) -> list[Array]:
        return list(self.built.operands)

    @property
    def semiring(self) -> str:
        return self.built.semiring

    @property
    def name(self) -> str:
        return f"{self.problem} of the {self.graph} ({self.n} vertices, {len(self.edges)} edges)"


def random_greedy(repeats: int) -> Any:
    # opt_einsum's random-greedy runs ``repeats`` greedy orders, trial r drawing its choices
    # from random.seed(r), and keeps the one whose largest intermediate is least. Measured on
    # 2 CPUs for random 3-regular MIS networks of 50/100/150/200 vertices: plain greedy leaves
    # 2^9/2^13/2^23/2^33 elements (0.01-0.1 s), 64 trials 2^8/2^12/2^20/2^29 (0.4/0.9/1.5/2.4 s),
    # 256 trials another 2^1 less in 4x the time; a min-fill elimination order did no better
    # (2^32 at 200). opt_einsum breaks ties in the order of Python's sets of index characters,
    # which changes from process to process: set PYTHONHASHSEED (to any number) for the same
    # plans each run.
    return opt_einsum.RandomGreedy(max_repeats=repeats, minimize="size")


def planner(name: str, trials: int, seconds: float = 60.0, seed: int = 0) -> tuple[Any, str]:
    """--planner's optimizer, and its description. "auto" is tropical.einsum's default: past 64
    operands, cotengra's random-greedy search (256 trials in 8 seeded searches, the order of
    least modelled GPU time kept) where aionvrtc[cotengra] is installed, else opt_einsum's
    choice. "hyper" is cotengra's HyperOptimizer for ``seconds``
    over every CPU, with greedy trials and graph partitions by label propagation, each tree
    refined by subtree reconfiguration, scored by products and writes together ("combo": a
    copy costs about what a product does here). In 20 s over the 16 CPUs of an H100 host it
    found space complexity 27 and time 38.3 for the 38 x 38 king's subgraph, where
    random-greedy's 1,024 trials leave 31 and 42.0 and row by row 36 and 43.3
    (benchmarks/results/einsum_planners-2-vcpus.md): a lattice's good orders cut it in parts,
    which greedy steps do not find. Not seeded: its trials depend on the time. "hyper-roofline"
    is the same search scored by each order's modelled time on a GPU instead
    (``tropical.roofline_objective``): its steps' pairs at the probe's rate, its bytes at the
    copy bandwidth, a step of few outputs at the fraction of the GPU it fills."""
    if name in ("hyper", "hyper-roofline"):
        import cotengra

        roofline = name == "hyper-roofline"
        optimizer = cotengra.HyperOptimizer(
            methods=["greedy", "labels"], max_time=seconds, max_repeats=1_000_000,
            minimize=tropical.roofline_objective() if roofline else "combo", parallel=True,
            optlib="random", progbar=False,
        )  # fmt: skip
        score = ", scored by the roofline model" if roofline else ""
        return optimizer, f"cotengra HyperOptimizer (greedy, labels), {seconds:g} s{score}"
    if name == "random-greedy":
        return random_greedy(trials), f"opt_einsum random-greedy, {trials} trials"
    if name == "cotengra":
        import cotengra

        optimizer = cotengra.RandomGreedyOptimizer(max_repeats=trials, seed=seed, parallel=False)
        return optimizer, f"cotengra random-greedy, {trials} trials, seed {seed}"
    return "auto", "auto"


def networks(args: argparse.Namespace) -> list[Network]:
    """The instances the flags ask for, each graph drawn from its own seeded generator."""
    found = []
    # A planner each: cotengra's optimizers keep what they learnt of one contraction.
    plan = functools.partial(planner, args.planner, args.trials, args.plan_time)
    for n in args.regular:
        edges = random_regular_graph(n, 3, np.random.default_rng([args.seed, n]))
        mis = problems.independent_set(edges, vertices=range(n))
        found.append(Network("MIS", "random 3-regular graph", mis, *plan()))
    for side in args.kings:
        mis = problems.independent_set(kings_graph(side), vertices=range(side * side))
        # Row by row: side + 1 vertices are open at once (2^21 elements for the 20 x 20 grid),
        # where opt_einsum's planners leave 2^29 (random-greedy, 64 trials, in 26 s).
        inputs = mis.subscripts.split("->")[0].split(",")
        path = elimination_path(inputs, map(symbol, range(side**2)))
        # Each 2 x 2 block of the grid holds at most one vertex of an independent set, and every
        # other vertex of every other row is one: ceil(side / 2)^2.
        found.append(Network("MIS", f"{side}x{side} king's graph", mis, path, "row by row",
                             known=((side + 1) // 2) ** 2))  # fmt: skip
    for side in args.kings_subgraph:
        n, edges = kings_subgraph(side, args.filling, np.random.default_rng([args.seed, side, 2]))
        mis = problems.independent_set(edges, vertices=range(n))
        # Row by row leaves up to side + 1 vertices open where the rows are fullest: 2^36
        # elements for 38 x 38 at filling 0.8, where cotengra's HyperOptimizer finds 2^27.
        graph = f"{side}x{side} king's subgraph at filling {args.filling:g}"
        found.append(Network("MIS", graph, mis, *plan()))
    for n in args.spin_glass:
        rng = np.random.default_rng([args.seed, n, 1])
        edges = random_regular_graph(n, 3, rng)
        glass = problems.spin_glass(edges, spin_glass_couplings(edges, rng), vertices=range(n))
        found.append(Network("spin glass", "random 3-regular graph", glass, *plan()))
    for side in args.square_spin_glass:
        edges = square_lattice(side)
        couplings = spin_glass_couplings(edges, np.random.default_rng([args.seed, side, 3]))
        glass = problems.spin_glass(edges, couplings, vertices=range(side * side))
        graph = f"{side}x{side} square lattice"
        if args.planner != "rows":
            found.append(Network("spin glass", graph, glass, *plan()))
            continue
        # A sweep row by row keeps side spins open and, unlike the planners' orders of
        # this lattice, lays each step's operands out as its product reads them: one copy,
        # where cotengra's orders copy over 10^11 elements between steps. Checked against
        # the sweep column by column.
        inputs = glass.subscripts.split("->")[0].split(",")
        rows = elimination_path(inputs, map(symbol, range(side * side)))
        by_column = (r * side + c for c in range(side) for r in range(side))
        found.append(Network("spin glass", graph, glass, rows, "row by row",
                             second=elimination_path(inputs, map(symbol, by_column))))  # fmt: skip
    return found


def second_order(net: Network, memory_limit: int) -> tuple[tropical.EinsumPlan, str]:
    """Another order or slicing of ``net``, and which, for a check where no brute force or
    NumPy reaches: the network's own second order, sliced as the first; for a network in
    slices, its own order in slices of a quarter the size (another order so sliced would cost
    far more: cotengra's random-greedy leaves the 38 x 38 king's subgraph 8,192 slices and
    2^50.5 products at 2^27 bytes); else cotengra's random-greedy seeded otherwise (else
    opt_einsum's random-greedy), sliced to a quarter of ``memory_limit``."""
    assert net.plan is not None
    quarter = max(4, memory_limit // 4)
    if net.second is not None:
        optimize, what = net.second, "another order"
    elif net.plan.slicing is not None:
        optimize, what = net.plan.path, "another slicing"
    else:
        try:
            optimize, _ = planner("cotengra", 64, seed=1)
        except ImportError:
            optimize = random_greedy(64)
        what = "another order"
    limit = memory_limit if net.second is not None else quarter
    plan = tropical.einsum_plan(
        net.subscripts, *net.operands, optimize=optimize, memory_limit=limit
    )
    return plan, what


def log2(x: int) -> str:
    return f"2^{math.log2(x):.0f}" if x & (x - 1) == 0 else f"2^{math.log2(x):.1f}"


def summary(plan: tropical.EinsumPlan) -> str:
    line = (
        f"{len(plan.steps)} steps, largest intermediate {log2(plan.largest_intermediate)} "
        f"({plan.largest_intermediate:,}) elements, {log2(plan.products)} products, "
        f"{plan.copies} copies ({plan.copied_elements:,} elements)"
    )
    if plan.slicing is None:
        return line
    return (
        f"{line}; in {plan.slicing.count:,} slices over {len(plan.slicing.indices)} indices: "
        f"space complexity {plan.space_complexity:.0f} a slice, time {plan.time_complexity:.1f}"
    )


def check(net: Network, value: float, assignment: dict[str, int]) -> str:
    """Raises unless ``assignment`` attains ``value`` (scored from the graph again, not from
    the network); else says what it is."""
    try:
        attained = net.built.value(assignment)
    except ValueError as e:  # the set is not independent
        raise SystemExit(f"{net.name}: {e}") from None
    if attained != value:
        raise SystemExit(f"{net.name}: the assignment attains {attained:g}, not {value:g}")
    if net.problem == "MIS":
        return f"an independent set of {len(net.built.selected(assignment))} vertices"
    return f"spins of energy {attained:g}"


def brute_force(net: Network) -> int:
    if net.problem == "MIS":
        return brute_force_mis(net.n, net.edges)
    couplings = [int(j) for j in net.built.edge_weights]
    return brute_force_ground_energy(net.n, net.edges, couplings)


async def median_ms(
    run: Callable[[], Awaitable[Any]], sync: Callable[[], Any], repeats: int
) -> float:
    """The median wall time of ``run`` until the GPU is done (``sync``), after a warm-up run:
    a network of small steps is bound by launching them, which a GPU-side timer leaves out."""
    await run()
    sync()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        await run()
        sync()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1e3


def torch_semiring_einsum() -> tuple[Any, Any] | str:
    """(torch, torch_semiring_einsum), or why they cannot run here."""
    try:
        import torch
        import torch_semiring_einsum as tse
    except ImportError as exc:
        return f"{exc.name} is not installed"
    if not torch.cuda.is_available():
        return "PyTorch sees no CUDA GPU"
    return torch, tse


def tse_contract(
    plan: tropical.EinsumPlan, tensors: Sequence[Any], semiring: str, torch: Any, tse: Any
) -> Any:
    """The scalar contraction by torch-semiring-einsum, step by step along ``plan``: each step
    is the same batched product over the same merged index groups (batch, rows, summed,
    columns) as on our GPU, "bmk,bkn->bmn" ("bmk->bm" for a reduction within one operand)."""
    maximise = semiring == "maxplus"
    best = torch.maximum if maximise else torch.minimum
    reduce = torch.amax if maximise else torch.amin

    def tropical_sum(compute_sum: Callable[..., Any]) -> Any:
        # The semiring: (+) is max (min), (x) is +. tse asks for in-place updates of a block's
        # accumulator and a reduction of a block over the summed dims (none: the block itself).
        def add_in_place(a: Any, b: Any) -> None:
            best(a, b, out=a)

        def sum_block(a: Any, dims: tuple[int, ...]) -> Any:
            return reduce(a, dim=dims) if dims else a

        def multiply_in_place(a: Any, b: Any) -> None:
            a.add_(b)

        return compute_sum(add_in_place, sum_block, multiply_in_place)

    product = tse.compile_equation("bmk,bkn->bmn")
    reduction = tse.compile_equation("bmk->bm")
    # 1 GiB of blocks: tse then needs no query of the free memory (slow) on each call.
    block = tse.AutomaticBlockSize(max_cuda_bytes=1 << 30)
    sizes = plan.sizes

    def grouped(x: Any, indices: tuple[str, ...], groups: Sequence[tuple[str, ...]]) -> Any:
        axes = [indices.index(i) for g in groups for i in g]
        return x.permute(axes).reshape([math.prod(sizes[i] for i in g) for g in groups])

    # Operands by number (see tropical's Step): the inputs, then each step's result. Where the
    # plan cut a long K in parts (a batch index of partial products, then their sum), tse
    # contracts K whole: it blocks its own loops.
    splits = {step.split for step in plan.steps if step.split is not None}
    live = {i: (x, t.indices) for i, (x, t) in enumerate(zip(tensors, plan.terms, strict=True))}
    for step in plan.steps:
        chosen = [live.pop(i) for i in step.operands]
        result = tuple(i for i in step.result if i not in splits)
        if step.second is None and set(step.k) <= splits:
            live[step.number] = chosen[0]  # the sum of K's parts: tse did not cut K
            continue
        batch = tuple(i for i in step.batch if i not in splits)
        if step.second is None:
            ((x, indices),) = chosen
            args: tuple[Any, ...] = (grouped(x, indices, [(), step.m, step.k]),)
            out = tse.semiring_einsum_forward(reduction, args, block, tropical_sum)
        else:
            if step.swapped:
                chosen.reverse()
            args = (
                grouped(*chosen[0], [batch, step.m, step.k]),
                grouped(*chosen[1], [batch, step.k, step.n]),
            )
            out = tse.semiring_einsum_forward(product, args, block, tropical_sum)
        live[step.number] = (out.reshape([sizes[i] for i in result]), result)
    ((x, _),) = live.values()
    return x


async def references(
    net: Network, args: argparse.Namespace, contract: Callable[..., Awaitable[Any]]
) -> dict[str, float]:
    """What the value must be, by what: brute force for small graphs, else NumPy along the
    same order, else the GPU along another order in other slices; and the formula, if any."""
    assert net.plan is not None
    row, plan = net.row, net.plan
    wants: dict[str, float] = {}
    if net.n <= BRUTE_FORCE_VERTICES:
        wants["brute force"] = brute_force(net)
    elif plan.slicing is None and plan.products <= args.numpy_products:
        started = time.perf_counter()
        wants["NumPy"] = float(tropical.reference.einsum(
            net.subscripts, *net.operands, semiring=net.semiring, path=plan.path
        ))  # fmt: skip
        row["numpy_s"] = time.perf_counter() - started
    else:
        started = time.perf_counter()
        other, what = second_order(net, args.memory_limit)
        row["second_planning_s"] = time.perf_counter() - started
        row["second_space_complexity"] = other.space_complexity
        row["second_slices"] = other.slicing.count if other.slicing else 1
        wants[what] = float(await contract(optimize=other))
    if net.known is not None:
        wants["formula"] = net.known
    return wants


async def solve(compiler: Compiler, net: Network, args: argparse.Namespace, tse: Any) -> None:
    """Contract ``net`` on the GPU with its assignment, check both, time the engines."""
    import cupy

    assert net.plan is not None
    plan = net.plan
    row = net.row
    arrays = [cupy.asarray(x) for x in net.operands]
    contract = functools.partial(
        tropical.einsum, net.subscripts, *arrays, semiring=net.semiring, optimize=plan,
        compiler=compiler,
    )  # fmt: skip
    try:
        result, assignment = await contract(argmax=True)
    except ValueError as exc:  # its argmaxes would not fit: the value alone
        if "keeps an int32 argmax of every step" not in str(exc):
            raise
        result, assignment = await contract(), None
        print(f"  no assignment: {str(exc).split(';')[0]}")
    value = row["value"] = float(result)
    what = check(net, value, assignment) if assignment is not None else "refused"
    wants = await references(net, args, contract)
    for by, want in wants.items():
        if want != value:
            raise SystemExit(f"{net.name}: the GPU gives {value:g}, {by} {want:g}")
    row["checked"] = " + ".join([*wants, *(["assignment"] if assignment is not None else [])])
    sync = cupy.cuda.Device().synchronize
    row["gpu_ms"] = await median_ms(contract, sync, args.repeats)
    if assignment is not None:
        row["gpu_argmax_ms"] = await median_ms(
            functools.partial(contract, argmax=True), sync, args.repeats
        )
    count = cupy.cuda.runtime.getDeviceCount()
    if plan.slicing is not None and count > 1:  # the slices spread over every GPU of the host

        def every() -> None:
            for device in range(count):
                cupy.cuda.Device(device).synchronize()

        spread = functools.partial(contract, devices=list(range(count)))
        if (spread_value := float(await spread())) != value:
            raise SystemExit(f"{net.name}: {count} GPUs give {spread_value:g}, one {value:g}")
        row["gpus"] = count
        row["gpus_ms"] = await median_ms(spread, every, args.repeats)
    if isinstance(tse, tuple) and plan.slicing is None and plan.largest_intermediate <= 1 << 27:
        torch, module = tse
        tensors = [torch.tensor(x).cuda() for x in net.operands]  # (a copy: read-only arrays)
        got = float(tse_contract(plan, tensors, net.semiring, torch, module))
        if got != value:
            raise SystemExit(f"{net.name}: torch-semiring-einsum gives {got}, not {value}")

        async def run() -> Any:
            return tse_contract(plan, tensors, net.semiring, torch, module)

        row["tse_ms"] = await median_ms(run, torch.cuda.synchronize, args.repeats)
    cupy.get_default_memory_pool().free_all_blocks()
    print(
        f"  {value:g} (checked: {row['checked']}), the assignment is {what}. "
        f"GPU {row['gpu_ms']:.1f} ms"
        + (f", with the assignment {row['gpu_argmax_ms']:.1f} ms" if assignment is not None else "")
        + (f", {row['gpus']} GPUs {row['gpus_ms']:.1f} ms" if "gpus_ms" in row else "")
        + (f", NumPy {row['numpy_s']:.2f} s" if "numpy_s" in row else "")
        + (f", torch-semiring-einsum {row['tse_ms']:.1f} ms" if "tse_ms" in row else "")
    )


def table(nets: Sequence[Network]) -> str:
    head = (
        f"{'problem':<11}{'graph':<42}{'n':>5}{'sc':>4}{'tc':>6}{'slices':>7}{'plan s':>7}"
        f"{'value':>7}{'GPU ms':>9}{'argmax ms':>10}{'GPUs ms':>9}{'NumPy s':>9}{'tse ms':>9}"
        "  checked"
    )
    lines = [head]
    for net in nets:
        r = net.row

        def cell(key: str, fmt: str, r: dict[str, Any] = r) -> str:
            return format(r[key], fmt) if key in r else "-"

        assert net.plan is not None
        slices = net.plan.slicing.count if net.plan.slicing else 1
        lines.append(
            f"{net.problem:<11}{net.graph:<42}{net.n:>5}{net.plan.space_complexity:>4.0f}"
            f"{net.plan.time_complexity:>6.1f}{slices:>7}{net.planning_s:>7.2f}"
            f"{cell('value', 'g'):>7}{cell('gpu_ms', '.1f'):>9}"
            f"{cell('gpu_argmax_ms', '.1f'):>10}{cell('gpus_ms', '.1f'):>9}"
            f"{cell('numpy_s', '.2f'):>9}{cell('tse_ms', '.1f'):>9}"
            f"  {r.get('checked', '-')}"
        )
    return "\n".join(lines)


def facts(tse: tuple[Any, Any] | str) -> dict[str, Any]:
    """The GPU, its driver, and the versions that produced the results."""
    import importlib.metadata

    import cupy

    def version(name: str) -> str:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return "not installed"

    import aionvrtc

    properties = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
    name = properties["name"]
    found = {
        "gpu": name.decode() if isinstance(name, bytes) else str(name),
        "driver_cuda": cupy.cuda.runtime.driverGetVersion(),  # the CUDA version it runs
        "cuda_runtime": cupy.cuda.runtime.runtimeGetVersion(),
        "nvrtc": ".".join(map(str, cupy.cuda.nvrtc.getVersion())),
        "cupy": cupy.__version__,
        "aionvrtc": aionvrtc.__version__,
        "opt_einsum": opt_einsum.__version__,
        **{name: version(name) for name in ("cotengra", "cotengrust")},
        "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
    }
    try:
        import pynvml  # nvidia-ml-py: the driver's own version number

        pynvml.nvmlInit()
        found["driver"] = pynvml.nvmlSystemGetDriverVersion()
    except Exception:  # no NVML here: the CUDA version alone
        pass
    if isinstance(tse, tuple):
        found["torch"] = tse[0].__version__
        found["torch_semiring_einsum"] = importlib.metadata.version("torch-semiring-einsum")
    else:
        found["torch_semiring_einsum"] = f"skipped: {tse}"
    return found


def path_key(net: Network) -> str:
    """A network's key in --paths: its subscripts' digest (the couplings change no path)."""
    return hashlib.sha256(net.subscripts.encode()).hexdigest()[:16]


def use_paths(nets: Sequence[Network], kept: dict[str, Any], file: str) -> None:
    """Each network found in ``kept`` (read from --paths ``file``) takes its path there, and
    the name of the planner that found it, whatever --planner says."""
    for net in nets:
        if (entry := kept.get(path_key(net))) is not None:
            net.optimize = [tuple(pair) for pair in entry["path"]]
            net.planner, net.path_from = entry["planner"], file


async def write_paths(kept: dict[str, Any], file: str) -> None:
    """``kept`` into --paths ``file``, a network a line, whole or not at all (a new file moved
    over the old)."""
    lines = ",\n".join(f" {json.dumps(key)}: {json.dumps(entry)}" for key, entry in kept.items())
    await anyio.Path(f"{file}.new").write_text("{\n" + lines + "\n}\n")
    await anyio.Path(f"{file}.new").rename(file)


def launched(net: Network) -> tropical.EinsumPlan:
    """The plan whose steps the GPU launches: a slice's, where the plan is sliced."""
    plan = net.plan
    assert plan is not None
    if plan.slicing is None:
        return plan
    views = plan.slicing.views(plan.inputs, net.operands, 0)
    return tropical.einsum_plan(plan.slicing.subscripts, *views, optimize=plan.path)


async def main(args: argparse.Namespace) -> None:
    # --arch, else $AIONVRTC_ARCH, else this GPU's; sm_90 on a machine without one.
    target = resolve_target(args.arch, default="sm_90")
    nets = runnable = networks(args)  # (every network runs: the large ones in slices)
    kept: dict[str, Any] = {}
    if args.paths and await anyio.Path(args.paths).exists():
        kept = json.loads(await anyio.Path(args.paths).read_text())
        use_paths(nets, kept, args.paths)
    for net in nets:
        # Planning time is the order's search and the slicing to --memory-limit together.
        started = time.perf_counter()
        net.plan = tropical.einsum_plan(
            net.subscripts, *net.operands, optimize=net.optimize, memory_limit=args.memory_limit
        )
        net.planning_s = time.perf_counter() - started
        planner = net.planner + (f" (path read from {net.path_from})" if net.path_from else "")
        print(f"{net.name}, {planner} ({net.planning_s:.2f} s): {summary(net.plan)}")
        net.row = {
            "problem": net.problem, "graph": net.graph, "vertices": net.n,
            "edges": len(net.edges), "planner": planner, "planning_s": net.planning_s,
            "steps": len(net.plan.steps), "largest_intermediate": net.plan.largest_intermediate,
            "products": net.plan.products, "copies": net.plan.copies,
            "space_complexity": net.plan.space_complexity,
            "time_complexity": net.plan.time_complexity,
            "slices": net.plan.slicing.count if net.plan.slicing else 1,
        }  # fmt: skip
        kept[path_key(net)] = {"network": net.name, "planner": net.planner, "path": net.plan.path}
        if args.paths:  # after each network: a long search is not lost to a later failure
            await write_paths(kept, args.paths)
    async with Compiler(arch=target) as compiler:
        # Compiled ahead, concurrently: the kernels each plan launches, with and without argmax.
        specs: dict[KernelSpec, None] = {}
        for net in runnable:
            launches = launched(net)
            for argmax in (False, True):
                specs.update(dict.fromkeys(launches.kernel_specs(net.semiring, argmax=argmax)))
        kinds: dict[KernelSpec, str] = {}

        async def compile_one(spec: KernelSpec) -> None:
            kinds[spec] = (await compiler.compile(spec)).kind

        async with anyio.create_task_group() as tg:
            for spec in specs:
                tg.start_soon(compile_one, spec)
        print(f"compiled {len(specs)} kernel(s) for {target}:")
        for spec in specs:
            print(f"  {spec.name_expressions[0]} ({kinds[spec]})")
        if not specs:
            raise SystemExit("nothing to run: no network was asked for")
        try:
            await compiler.get(next(iter(specs)))  # compiled for this GPU's arch and loaded
        except (NoDeviceError, ModuleLoadError) as exc:  # no GPU here, or a driver too old
            small = sum(net.n <= BRUTE_FORCE_VERTICES for net in runnable)
            numpy = sum(
                net.n > BRUTE_FORCE_VERTICES
                and net.plan.slicing is None
                and net.plan.products <= args.numpy_products
                for net in runnable
                if net.plan is not None
            )
            sliced = sum(net.plan.slicing is not None for net in runnable if net.plan is not None)
            print(
                f"no usable GPU for {target} here ({type(exc).__name__}): would contract "
                f"{len(runnable)} network(s) ({sliced} in slices) with their assignments, check "
                f"{small} against brute force, {numpy} against NumPy along the same order and "
                f"{len(runnable) - small - numpy} against another order or slicing, and time "
                f"each over "
                f"{args.repeats} runs, against torch-semiring-einsum where it is installed"
            )
            return
        tse = torch_semiring_einsum()
        if isinstance(tse, str):
            print(f"torch-semiring-einsum skipped: {tse}")
        for net in runnable:
            print(f"{net.name}:")
            await solve(compiler, net, args, tse)
    print(table(nets))
    if args.json:
        results = {"facts": facts(tse), "args": vars(args), "rows": [net.row for net in nets]}
        await anyio.Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--regular",
        type=int,
        nargs="*",
        default=[20, 100, 150, 200],
        help="MIS of random 3-regular graphs of these many vertices",
    )
    parser.add_argument(
        "--kings",
        type=int,
        nargs="*",
        default=[4, 10, 15, 20],
        help="MIS of king's graphs of these sides",
    )
    parser.add_argument(
        "--spin-glass",
        type=int,
        nargs="*",
        default=[20, 100, 150],
        help="ground states of +-1 spin glasses on random 3-regular graphs",
    )
    parser.add_argument(
        "--kings-subgraph",
        type=int,
        nargs="*",
        default=[],
        help="MIS of king's subgraphs of these sides, --filling of the sites kept",
    )
    parser.add_argument("--filling", type=float, default=0.8, help="of the king's subgraphs")
    parser.add_argument(
        "--square-spin-glass",
        type=int,
        nargs="*",
        default=[],
        help="ground states of +-1 spin glasses on square lattices of these sides",
    )
    parser.add_argument(
        "--memory-limit",
        type=int,
        default=1 << 32,
        help="bytes a slice's largest intermediate may hold: larger networks run in slices",
    )
    parser.add_argument(
        "--planner",
        choices=["auto", "hyper", "hyper-roofline", "cotengra", "random-greedy", "rows"],
        default="auto",
        help="the contraction orders' search: einsum's default, cotengra's HyperOptimizer "
        "(--plan-time; hyper-roofline: scored by modelled GPU time), cotengra's random-greedy "
        "(seeded) or opt_einsum's (--trials); rows: "
        "the square lattices swept row by row, the other graphs planned as by auto",
    )
    parser.add_argument(
        "--plan-time", type=float, default=60.0, help="seconds of --planner hyper's search"
    )
    parser.add_argument(
        "--numpy-products",
        type=int,
        default=1 << 30,
        help="check against NumPy only plans of at most this many products",
    )
    parser.add_argument(
        "--paths", help="a JSON file of contraction paths: read where it holds a network's, "
        "and written with every network's",
    )  # fmt: skip
    parser.add_argument("--trials", type=int, default=256, help="random-greedy's trials")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs of each engine")
    parser.add_argument("--seed", type=int, default=2026, help="seeds every graph")
    parser.add_argument("--json", help="write the results (and the GPU's facts) to this file")
    parser.add_argument(
        "--arch", help="compile for this arch (default: $AIONVRTC_ARCH, the GPU's, else sm_90)"
    )  # fmt: skip
    anyio.run(main, parser.parse_args())
