"""Planning a tropical einsum: the contraction order (opt_einsum, cotengra), then each step as one
batched product C[b, m, n] = (+)_k A[b, m, k] (x) B[b, k, n] over strided 3-D views of its
operands.

An index group (the batch, row, column or contracted indices of a step) becomes one dimension
of a view when its indices, in some order, step through memory like one axis: each stride is the
next one times the next size. The operands' element strides are known when planning (inputs'
from the arrays or C order, intermediates are made contiguous), so the plan says exactly which
operands are read in place and which are copied first. Pure Python: no GPU needed.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._bounded import keep
from ..products import Offload, Work
from ._orders import ranked_path
from ._plan import ADDRESSABLE, ADDRESSABLE_BYTES, WIDEST, EinsumPlan, check_step
from ._slicing import Slicing, TooSmall, slicing_for
from ._subscripts import check_output, index_sizes, parse_subscripts
from ._terms import Step, Strides, Term, View, contiguous, input_terms

__all__ = [
    "LARGE_NETWORK",
    "LARGE_NETWORK_TRIALS",
    "SEARCH_LIMITS",
    "einsum_plan",
    "known_plan",
    "planned_for",
]

# The most operands for which an exhaustive opt_einsum strategy is run: their time grows
# exponentially with the count ('optimal' tries every order; 'branch-all' and 'branch-2' all
# or 2**n of them; 'dp' every connected subset, exponential in the worst case). On random
# networks of three bonds a tensor, at these counts each took 1 to 10 s on a loaded 2-CPU
# machine, and past them time multiplies ('optimal': 10 operands 16 s, 12 never finished).
# Beyond the count the name is refused rather than swapped for another strategy with a
# warning: 'auto' and 'auto-hq' are opt_einsum's strategies that choose by the count, a named
# one asks for its search, and a plan found otherwise would be cached and reused as if it
# were that search's, where a warning is easily missed. An optimizer object runs as given.
SEARCH_LIMITS = {"optimal": 9, "branch-all": 9, "branch-2": 18, "dp": 20, "dynamic-programming": 20}

# Past this many operands optimize="auto" plans with cotengra's random-greedy search, seeded
# (the same plan in every process), where aionvrtc[cotengra] is installed: opt_einsum's "auto"
# is one greedy order there. Measured on 2 CPUs (benchmarks/results/einsum_planners-2-vcpus.md):
# for the MIS of random 3-regular graphs of 200 and 220 vertices one greedy order leaves
# intermediates of 2^36 elements, 256 random-greedy trials 2^31 and 2^34 in 0.8-0.9 s. The
# trials run as RANKED_SEARCHES searches of 32, and of their 8 orders the one of least modelled
# time on a GPU is kept (_orders.ranked_path): one search's best by products streams bytes in
# steps of short K, modelled at 357 ms and 2.7 s on an H200, the ranked 13.6 ms and 100 ms
# (1.2 and 1.5 s of planning). On lattices greedy steps stay poor (the 38 x 38 king's subgraph:
# 2^33, where a HyperOptimizer's partitions find 2^27): the docs say to pass one there.
# Without cotengrust, cotengra's greedy runs in Python, 290x slower: "auto" stays opt_einsum's.
LARGE_NETWORK = 64
LARGE_NETWORK_TRIALS = 256


def einsum_plan(
    subscripts: str, *operands: Any, optimize: Any = "auto", memory_limit: int | None = None
) -> EinsumPlan:
    """Plan ``einsum(subscripts, *operands)`` without running it, and without a GPU.

    The plan holds the contraction order, each step's batched product, the copies, and its
    ``space_complexity`` and ``time_complexity``. Plans are kept: asking again with the same
    strategy name (or a path as a tuple of tuples, as ``EinsumPlan.path`` holds it) for
    operands of the same layouts returns the same plan.

    Refused with a ValueError before planning goes far: subscripts naming more indices for an
    operand or the output than an array has dimensions (64), an output or a step's result past
    what 64-bit offsets address (``ADDRESSABLE_BYTES``), and a strategy whose time grows
    exponentially with the operands ('optimal', 'branch-all', 'branch-2', 'dp') on more than
    ``SEARCH_LIMITS`` allows.

    Args:
        subscripts: NumPy's einsum grammar, as ``einsum`` takes it.
        *operands: Arrays (NumPy, CuPy: their shapes and strides count) or shapes (tuples of
            ints, taken as C order), one per operand of ``subscripts``.
        optimize: An opt_einsum strategy name ("auto", "greedy", "random-greedy", "optimal",
            ...), an opt_einsum PathOptimizer, a cotengra optimizer (a ``HyperOptimizer``: for
            networks of hundreds of tensors; the indices it slices, with ``slicing_opts``, are
            sliced), an explicit path (opt_einsum's format, ``[(0, 1), (0, 1)]``), or an
            EinsumPlan for the same shapes (returned as it is where it was made for these
            operands and no ``memory_limit`` is given).
            ``"auto"`` plans a network of more than 64 operands with cotengra's random-greedy
            search (256 trials, seeded: the same plan in every process) where
            ``aionvrtc[cotengra]`` is installed with cotengrust.
        memory_limit: Bytes (arrays count their item size, shapes 8 bytes an element): slice
            the contraction so that no intermediate of a slice holds more. The plan's
            ``slicing`` says over which indices (only indices the output does not keep), and
            ``einsum`` contracts the slices one by one and sums them. None: sliced only where
            the planner (or the plan given as ``optimize``) sliced.

    Returns:
        The plan, to pass as ``optimize=``.

    Raises:
        TypeError: ``subscripts`` is not a str, or an operand is neither an array nor a shape.
        ValueError: ``memory_limit`` is not an int > 0, or no slicing meets it (the message
            names the smallest that does).
        ValueError: The subscripts are malformed (an ellipsis, more than one ``->``, a
            character that is not an index, an output index repeated or in no operand, another
            count of operands than given) or name more than 64 indices for an operand or the
            output; an operand's dimensions are not the ones its subscripts name; an index has
            two sizes; a shape has a negative size.
        ValueError: An output or a step's result past ``ADDRESSABLE_BYTES``.
        ValueError: ``optimize`` is not an opt_einsum strategy, optimizer or path for these
            operands (a path entry that does not name one or two of the operands left, a path
            that leaves more than one), a plan for other subscripts or shapes, or a search
            whose time grows exponentially on more operands than ``SEARCH_LIMITS`` allows; or
            its planner sliced an index the output keeps.
    """
    if memory_limit is not None and (
        not isinstance(memory_limit, int | np.integer) or isinstance(memory_limit, bool)
        or memory_limit <= 0
    ):  # fmt: skip
        raise ValueError(f"memory_limit must be a number of bytes > 0, got {memory_limit!r}")
    if (
        isinstance(optimize, EinsumPlan)
        and memory_limit is None
        and optimize.planned_for(subscripts, operands)
    ):
        return optimize
    memo = _memo(subscripts, operands, optimize, memory_limit)
    try:
        found = _plans.get(memo) if memo is not None else None
    except TypeError:  # something in a layout is not hashable: planned every time
        memo = found = None
    if found is not None:
        return found
    planned = _plan(subscripts, operands, optimize, memory_limit)
    if memo is not None:
        keep(_plans, memo, planned, _KEYS)
    return planned


def known_plan(subscripts: str, operands: Sequence[Any], optimize: Any) -> EinsumPlan | None:
    """``einsum_plan``'s plan where it is at hand (a plan for these operands, or one made
    before for a strategy's name), else None: no planning, O(operands)."""
    if isinstance(optimize, EinsumPlan):
        return optimize if optimize.planned_for(subscripts, operands) else None
    memo = _memo(subscripts, operands, optimize, None)
    try:
        return _plans.get(memo) if memo is not None else None
    except TypeError:
        return None


# Plans by (subscripts, strategy name, operands' layouts): a network contracted again is not
# planned again (opt_einsum's path for a name is the same each time: see _cached_path).
_plans: dict[Any, EinsumPlan] = {}


def _memo(subscripts: str, operands: Sequence[Any], optimize: Any, memory_limit: Any) -> Any:
    if not isinstance(optimize, str | tuple):  # a name, or a path as a plan gives it
        return None
    layouts: list[Any] = []
    for x in operands:
        try:
            layouts.append((x.shape, x.strides, x.itemsize))
        except AttributeError:
            if not isinstance(x, tuple | list):
                return None  # einsum_plan says what is wrong with it
            layouts.append(tuple(x))
    return (subscripts, optimize, memory_limit, *layouts)


def _plan(
    subscripts: str, operands: Sequence[Any], optimize: Any, memory_limit: int | None
) -> EinsumPlan:
    inputs, output = parse_subscripts(subscripts, len(operands))
    shaped = [_Shaped.of(x, i) for i, x in enumerate(operands)]
    sizes = index_sizes(inputs, shaped)
    check_output(output, sizes, itemsize=WIDEST, limit=ADDRESSABLE_BYTES, bound=ADDRESSABLE)
    strides = [x.strides for x in shaped]
    if isinstance(optimize, EinsumPlan):
        if list(optimize.inputs) != inputs or optimize.output != output:
            raise ValueError(
                f"optimize is a plan for {optimize.subscripts!r}, not {subscripts!r}; make one "
                "with einsum_plan for these subscripts"
            )
        if optimize.shapes() != [x.shape for x in shaped]:
            raise ValueError(
                f"optimize is a plan for shapes {optimize.shapes()}, not "
                f"{[x.shape for x in shaped]}; make one with einsum_plan for these operands"
            )
        now = input_terms(inputs, strides)
        if memory_limit is None and [t.strides for t in optimize.terms] == [t.strides for t in now]:
            return optimize
        path, given = optimize.path, optimize.slicing.indices if optimize.slicing else ()
    else:
        path, given = _path(tuple(inputs), output, tuple(sorted(sizes.items())), optimize)
    # A plain str: the plan is kept for any semiring (a network's own is checked by each run).
    planned = _program(
        str(subscripts), inputs=inputs, output=output, sizes=sizes, strides=strides, path=path
    )
    itemsize = next((x.itemsize for x in operands if hasattr(x, "itemsize")), WIDEST)
    sliced = _sliced(planned, given, memory_limit, itemsize)
    if sliced:
        kept = ["".join(i for i in term if i not in sliced) for term in inputs]
        planned = dataclasses.replace(
            planned,
            slicing=Slicing(sliced, tuple(sizes[i] for i in sliced), f"{','.join(kept)}->{output}"),
        )
    # Arrays' byte strides, as a later run compares them (a shape tuple has none: re-checked).
    layouts = tuple(
        (tuple(x.shape), tuple(x.strides), x.itemsize) if hasattr(x, "strides") else ((), (), 0)
        for x in operands
    )
    return dataclasses.replace(planned, layouts=layouts, key=_intern(planned))


# Plans' keys by what they do, bounded: a plan whose content was dropped gets a new key (its
# runs' caches miss once, nothing more).
_KEYS = 4096
_keys: dict[Any, int] = {}
_counter = itertools.count()
_TOKEN = uuid.uuid4().hex


def _intern(planned: EinsumPlan) -> tuple[str, int]:
    content = (planned.subscripts, planned.path, planned.terms, tuple(planned.sizes.items()))
    found = _keys.get(content)
    if found is None:
        if len(_keys) >= _KEYS:
            _keys.clear()
        found = _keys[content] = next(_counter)
    return _TOKEN, found


@dataclass(frozen=True, slots=True)
class _Shaped:
    """What planning needs of an operand."""

    shape: tuple[int, ...]
    strides: Strides

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @classmethod
    def of(cls, x: Any, position: int) -> _Shaped:
        if isinstance(x, tuple | list) and all(isinstance(n, int | np.integer) for n in x):
            shape = tuple(int(n) for n in x)
            if any(n < 0 for n in shape):
                raise ValueError(
                    f"einsum operand {position}: a shape has no negative sizes, got {shape}"
                )
            return cls(shape, contiguous(shape))
        if hasattr(x, "shape") and hasattr(x, "strides") and hasattr(x, "itemsize"):
            return cls(tuple(x.shape), tuple(s // x.itemsize for s in x.strides))
        raise TypeError(
            f"einsum operand {position} must be an array (cupy, numpy) or a shape tuple, not "
            f"{type(x).__name__}"
        )


def _sliced(
    planned: EinsumPlan, given: tuple[str, ...], memory_limit: int | None, itemsize: int
) -> tuple[str, ...]:
    """The indices to slice ``planned`` over: ``given`` (by its planner), then as many as it
    takes for ``memory_limit``."""
    outer = [i for i in given if i in planned.output]
    if outer:
        raise ValueError(
            f"the planner sliced the output's indices {outer}; einsum slices only indices the "
            "output does not keep (cotengra: slicing_opts={..., 'allow_outer': False})"
        )
    if 0 in planned.sizes.values():
        return ()  # nothing is computed: the result is the zero
    if memory_limit is None:
        return given
    try:
        return slicing_for(
            planned.inputs, planned.output, planned.sizes, planned.path,
            elements=memory_limit // itemsize, given=given,
        )  # fmt: skip
    except TooSmall as small:
        raise ValueError(
            f"memory_limit={memory_limit:,} bytes: no slicing of {planned.subscripts!r} along "
            f"this order fits it; the smallest that does is {small.floor * itemsize:,} bytes "
            f"({small.floor:,} elements of {itemsize} bytes), or pick an order with smaller "
            "intermediates (optimize=)"
        ) from None


def _path(
    inputs: tuple[str, ...], output: str, sizes: tuple[tuple[str, int], ...], optimize: Any
) -> tuple[tuple[tuple[int, ...], ...], tuple[str, ...]]:
    """The contraction's path, and the indices its planner sliced (cotengra's)."""
    if isinstance(optimize, str):
        return _cached_path(inputs, output, sizes, optimize), ()
    if isinstance(optimize, list | tuple):  # an explicit path: _program checks each step
        try:
            return tuple(tuple(int(i) for i in p) for p in optimize), ()
        except (TypeError, ValueError):
            raise ValueError(
                f"optimize: a path is a list of tuples of operand positions, such as "
                f"[(0, 1), (0, 1)], got {optimize!r}"
            ) from None
    if callable(getattr(optimize, "search", None)):  # cotengra's: its tree says what it sliced
        return _cotengra_path(inputs, output, sizes, optimize)
    return _opt_einsum_path(inputs, output, sizes, optimize), ()


def _cotengra_path(
    inputs: tuple[str, ...], output: str, sizes: tuple[tuple[str, int], ...], optimize: Any
) -> tuple[tuple[tuple[int, ...], ...], tuple[str, ...]]:
    if len(inputs) == 1:
        return ((0,),), ()
    tree = optimize.search([tuple(t) for t in inputs], tuple(output), dict(sizes))
    path = tuple(tuple(int(i) for i in p) for p in tree.get_path())
    return path, tuple(str(i) for i in getattr(tree, "sliced_inds", ()))


@functools.lru_cache(maxsize=256)
def _cached_path(
    inputs: tuple[str, ...], output: str, sizes: tuple[tuple[str, int], ...], optimize: Any
) -> tuple[tuple[int, ...], ...]:
    if optimize.lower() == "auto" and len(inputs) > LARGE_NETWORK and _large_network_planner():
        return ranked_path(inputs, output, dict(sizes), LARGE_NETWORK_TRIALS)
    return _opt_einsum_path(inputs, output, sizes, optimize)


@functools.cache
def _large_network_planner() -> bool:
    """Whether cotengra and its compiled greedy search (cotengrust) import."""
    try:
        import cotengra  # noqa: F401
        import cotengrust  # noqa: F401
    except ImportError:
        return False
    return True


def _opt_einsum_path(
    inputs: Sequence[str], output: str, sizes: tuple[tuple[str, int], ...], optimize: Any
) -> tuple[tuple[int, ...], ...]:
    import opt_einsum

    try:
        if isinstance(optimize, str):  # (checked here: opt_einsum ignores it for 2 operands)
            opt_einsum.paths.get_path_fn(optimize)
    except KeyError as error:
        raise ValueError(
            f"optimize={optimize!r} is not an opt_einsum strategy, optimizer or path for "
            f"{len(inputs)} operands: {error}"
        ) from None
    limit = SEARCH_LIMITS.get(optimize.lower()) if isinstance(optimize, str) else None
    if limit is not None and len(inputs) > limit:
        raise ValueError(
            f"optimize={optimize!r} is a search whose time grows exponentially with the "
            f"operands, run here for at most {limit}, and this contraction has {len(inputs)}; "
            "pass 'auto' or 'auto-hq' (opt_einsum picks a search the count allows), 'greedy' "
            "or 'random-greedy', or an optimizer object to run it regardless "
            "(opt_einsum.DynamicProgramming(), a cotengra HyperOptimizer)"
        )
    if len(inputs) == 1:
        return ((0,),)
    # opt_einsum sees its own symbols, so that any index the grammar allows is one it takes.
    by_size = dict(sizes)
    symbol = {c: opt_einsum.get_symbol(i) for i, c in enumerate(by_size)}
    text = (
        ",".join("".join(symbol[c] for c in t) for t in inputs)
        + "->"
        + "".join(symbol[c] for c in output)
    )
    shapes = [tuple(by_size[c] for c in t) for t in inputs]
    try:
        path, _ = opt_einsum.contract_path(text, *shapes, shapes=True, optimize=optimize)
    except (TypeError, ValueError, KeyError, IndexError) as error:
        raise ValueError(
            f"optimize={optimize!r} is not an opt_einsum strategy, optimizer or path for "
            f"{len(inputs)} operands: {error}"
        ) from None
    return tuple(tuple(int(i) for i in p) for p in path)


def _program(
    subscripts: str,
    *,
    inputs: Sequence[str],
    output: str,
    sizes: Mapping[str, int],
    strides: Sequence[Strides],
    path: Sequence[tuple[int, ...]],
) -> EinsumPlan:
    """Each step of ``path`` as a batched product over views, copying only where none reads."""
    terms = tuple(input_terms(inputs, strides))
    sizes = dict(sizes)  # and the split indices' (see _split)
    readers = _readers(inputs, output, path)  # how each step's result will be read
    # Operands by number (inputs 0..n-1, then each step's result), in opt_einsum's list order:
    # a step's operands leave the list and its result joins the end.
    live: list[tuple[int, Term]] = list(enumerate(terms))
    steps: list[Step] = []

    def push(made: list[Step]) -> None:
        nonlocal live
        gone = set(made[0].operands)
        for step in made:
            check_step(
                len(steps), step, itemsize=WIDEST, limit=ADDRESSABLE_BYTES, bound=ADDRESSABLE
            )
            steps.append(step)
            gone.update(step.operands)
        result = Term(made[-1].result, contiguous([sizes[i] for i in made[-1].result]))
        live = [x for x in live if x[0] not in gone] + [(made[-1].number, result)]

    def number() -> int:
        return len(terms) + len(steps)

    for count, positions in enumerate(path):
        if (
            not 0 < len(positions) <= 2
            or any(not 0 <= p < len(live) for p in positions)
            or len(set(positions)) != len(positions)
        ):
            raise ValueError(
                f"optimize: path step {count} {tuple(positions)} does not name one or two of the "
                f"{len(live)} operands left (positions 0 to {len(live) - 1})"
            )
        chosen = [live[p] for p in positions]
        rest = [t for i, (_, t) in enumerate(live) if i not in positions]
        kept = set(output).union(*(t.indices for t in rest))
        wanted = None if rest else tuple(output)
        if len(chosen) == 1:
            ((at, term),) = chosen
            if kept.issuperset(term.indices):
                live = [x for x in live if x[0] != at] + [(at, term)]  # nothing to sum
            else:
                push(
                    _reduction(
                        term, kept, sizes, wanted=wanted, operands=(at,), number=number(),
                        read=readers.get(count),
                    )
                )  # fmt: skip
            continue
        (xn, x), (yn, y) = chosen
        # An index of only one of them that nothing later needs is summed within it first.
        if any(i not in y.indices and i not in kept for i in x.indices):
            push(
                _reduction(
                    x, kept | set(y.indices), sizes, wanted=None, operands=(xn,), number=number()
                )
            )
            xn, x = live[-1]
        if any(i not in x.indices and i not in kept for i in y.indices):
            push(
                _reduction(
                    y, kept | set(x.indices), sizes, wanted=None, operands=(yn,), number=number()
                )
            )
            yn, y = live[-1]
        push(
            _pair(
                x, y, kept, sizes=sizes, wanted=wanted, operands=(xn, yn), number=number(),
                read=readers.get(count),
            )
        )  # fmt: skip
    if len(live) != 1:
        raise ValueError(
            f"optimize: the path leaves {len(live)} operands, not one; a path contracts until "
            "one is left"
        )
    final = live[0][1]
    if set(final.indices) != set(output):
        raise ValueError(
            f"optimize: the path ends with indices {''.join(final.indices)!r}, not {output!r}"
        )
    return EinsumPlan(
        subscripts=subscripts,
        inputs=tuple(inputs),
        output=output,
        sizes=sizes,
        path=tuple(tuple(p) for p in path),
        terms=terms,
        steps=tuple(steps),
        # A result that is still an input (nothing to contract) is copied: einsum returns a
        # new array, never a view of an operand.
        final_copy=final.indices != tuple(output) or live[0][0] < len(terms),
    )


# How a later step reads a result: the groups of its indices that the read takes as its
# dimensions (batch, summed, its own; or kept and summed, for a sum over indices only it has).
_Read = tuple[frozenset[str], ...]


def _readers(
    inputs: Sequence[str], output: str, path: Sequence[tuple[int, ...]]
) -> dict[int, _Read]:
    """For each path entry whose result a later entry reads, how it reads it (``_Read``): the
    result can be read in place where each group lies contiguous in it. Index sets alone,
    along the path (as far as it is well formed: ``_program`` says what is wrong with the
    rest)."""
    live: list[tuple[int, frozenset[str]]] = [(-1, frozenset(t)) for t in inputs]
    readers: dict[int, _Read] = {}
    for count, positions in enumerate(path):
        if (
            not 0 < len(positions) <= 2
            or not all(0 <= p < len(live) for p in positions)
            or len(set(positions)) != len(positions)
        ):
            break
        chosen = [live[p] for p in positions]
        rest = [t for i, (_, t) in enumerate(live) if i not in positions]
        kept = frozenset(output).union(*rest)
        made_here = count
        if len(chosen) == 1:
            ((made, term),) = chosen
            if kept.issuperset(term):
                made_here = made  # nothing summed: it moves to the end, still made by `made`
            elif made >= 0:
                readers[made] = (term & kept, term - kept)
            result = term & kept
        else:
            for (made, own), (_, other) in (chosen, chosen[::-1]):
                if made < 0:  # an input: its layout is the caller's
                    continue
                private = own - other - kept
                if private:  # summed within it first
                    readers[made] = (own - private, private)
                else:
                    readers[made] = (own & other & kept, (own & other) - kept, own - other)
            result = (chosen[0][1] | chosen[1][1]) & kept
        live = [x for i, x in enumerate(live) if i not in positions] + [(made_here, result)]
    return readers


def _unread(result: Sequence[str], read: _Read | None, sizes: Any) -> int:
    """Elements that the step reading a result contiguous over ``result`` (as ``read`` says)
    must copy first: all of them where some group, over its indices of more than one value,
    is not one run of it."""
    if read is None:
        return 0
    wide = [i for i in result if sizes[i] != 1]
    for group in read:
        at = [n for n, i in enumerate(wide) if i in group]
        if at and at[-1] - at[0] + 1 != len(at):
            return math.prod(sizes[i] for i in result)
    return 0


def _ahead(group: Sequence[str], read: _Read | None) -> list[tuple[str, ...]]:
    """Orders of ``group`` that keep the indices of each of ``read``'s groups together, in each
    order of those groups (so that one can run across this group's boundary)."""
    if read is None:
        return []
    found: dict[tuple[str, ...], None] = {}
    for order in itertools.permutations(read):
        found[tuple(i for g in order for i in sorted(g) if i in group)] = None
    return list(found)


def _merge(term: Term, group: Sequence[str], sizes: Mapping[str, int]) -> tuple[int, int] | None:
    """(size, stride) of ``group`` as one dimension of ``term``, or None if no view can."""
    stride_of = dict(zip(term.indices, term.strides, strict=True))
    wide = [i for i in group if sizes[i] != 1]  # a size-1 index can sit anywhere
    size = math.prod(sizes[i] for i in group)
    if not wide or size == 0:  # (an empty operand is never read: einsum fills the zero)
        return size, 1  # any stride reads a single element; 1 keeps a layout row-major
    for outer, inner in itertools.pairwise(wide):
        if stride_of[outer] != stride_of[inner] * sizes[inner]:
            return None
    return size, stride_of[wide[-1]]


def _by_stride(group: Iterable[str], term: Term) -> tuple[str, ...]:
    stride_of = dict(zip(term.indices, term.strides, strict=True))
    return tuple(sorted(group, key=lambda i: -stride_of[i]))


def _view(term: Term, groups: Sequence[tuple[str, ...]], sizes: Mapping[str, int]) -> View:
    """``term`` as a 3-D view over ``groups``, copied to C order over them if no view reads it."""
    merged = [_merge(term, g, sizes) for g in groups]
    copy = None
    if any(m is None for m in merged):
        copy = tuple(i for g in groups for i in g)
        copied = Term(copy, contiguous([sizes[i] for i in copy]))
        merged = [_merge(copied, g, sizes) for g in groups]
    shape = tuple(m[0] for m in merged if m is not None)
    strides = tuple(m[1] for m in merged if m is not None)
    return View(copy, (shape[0], shape[1], shape[2]), (strides[0], strides[1], strides[2]))


def _orders(group: Sequence[str], *sources: Term | tuple[str, ...]) -> list[tuple[str, ...]]:
    """Candidate orders of ``group``: by each source term's strides, or a wanted order."""
    found: dict[tuple[str, ...], None] = {}
    for source in sources:
        if isinstance(source, Term):
            found[_by_stride(group, source)] = None
        else:
            found[tuple(i for i in source if i in group)] = None
    return list(found)


def _pair(
    x: Term,
    y: Term,
    kept: set[str],
    *,
    sizes: dict[str, int],
    wanted: tuple[str, ...] | None,
    operands: tuple[int, ...],
    number: int,
    read: _Read | None = None,
    relocate: bool = True,
) -> list[Step]:
    """``x`` and ``y`` contracted over their shared indices that are not ``kept``: the step
    (or steps, see _split and _relocated) whose views copy the fewest elements, counting the
    copy that the later step reading the result (``read``: _readers) would make of it."""
    batch = [i for i in x.indices if i in y.indices and i in kept]
    summed = [i for i in x.indices if i in y.indices and i not in kept]
    only_x = [i for i in x.indices if i not in y.indices]
    only_y = [i for i in y.indices if i not in x.indices]
    best: tuple[tuple[int, int, bool], Step] | None = None
    for swapped in (False, True):
        first, second = (y, x) if swapped else (x, y)
        m_group, n_group = (only_y, only_x) if swapped else (only_x, only_y)
        want: list[Term | tuple[str, ...]] = [wanted] if wanted else []
        k_orders = _orders(summed, first, second)
        candidates = list(
            itertools.product(
                _orders(batch, first, second, *want),
                k_orders,
                _orders(m_group, first, *want),
                _orders(n_group, second, *want),
            )
        )
        # Orders of the result that its reader can view in place.
        for order in _ahead(batch + m_group + n_group, read):
            b, m, n = (tuple(i for i in order if i in g) for g in (batch, m_group, n_group))
            candidates += [(b, k, m, n) for k in k_orders]
        for b, k, m, n in candidates:
            one, two = _view(first, (b, m, k), sizes), _view(second, (b, k, n), sizes)
            result = b + m + n
            final = wanted is not None and result != wanted
            size = math.prod(sizes[i] for i in result)
            later = size if final else _unread(result, read, sizes)
            copied = one.copied + two.copied + later
            rowmajor = one.strides[2] == 1 and two.strides[2] == 1
            score = (copied, not rowmajor, swapped)
            if best is None or score < best[0]:
                subscripts = "".join(x.indices) + "," + "".join(y.indices) + "->" + "".join(result)
                step = Step(operands, number, subscripts, swapped, b, m, k, n, one, two, result)
                best = (score, step)
    assert best is not None
    moved = _relocated(best[1], sizes) if relocate else ()
    if moved:  # a batch of few outputs over a long K: part of K summed as a batch first
        # Laid out so that the reduction reads it in place: the kept and the moved apart.
        by_reduction = (frozenset(best[1].result), frozenset(moved))
        partial = _pair(
            x, y, kept | set(moved), sizes=sizes, wanted=None, operands=operands, number=number,
            read=by_reduction, relocate=False,
        )  # fmt: skip
        last = partial[-1]
        term = Term(last.result, contiguous([sizes[i] for i in last.result]))
        reduced = _reduction(
            term, set(best[1].result), sizes, wanted=wanted, operands=(last.number,),
            number=last.number + 1, read=read,
        )  # fmt: skip
        return [*partial, *reduced]
    return _split(best[1], sizes, wanted)


def _relocated(step: Step, sizes: Mapping[str, int]) -> tuple[str, ...]:
    """The summed indices of a batched product of few outputs over a long K that its product
    should keep as batch indices, to be summed by a reduction after: the outermost of K's
    indices, as many as leave K parts of about RELOCATED_PART (a block's walk of them short:
    at about 1 us a tile of 16, the whole K on a few blocks is the step's time); () for a
    product that fills the GPU as it is (or one of no batch, which _split cuts by a split
    index of its own). (Measured on an H200: a 2 x 16 x 4 product over K = 2^20 ran on two
    blocks of the tiled kernel in 65 ms, a network's whole time.)"""
    b, m, k = step.first.shape
    n = step.second.shape[2] if step.second is not None else 1
    tiles = b * -(-m // 64) * -(-n // 64)
    if b == 1 or k < SPLIT_MIN_K or tiles * 4 > SPLIT_TILES:
        return ()
    moved: list[str] = []
    parts = 1
    for index in step.k:
        size = sizes[index]
        if k // (parts * size) < RELOCATED_PART or tiles * parts * size > RELOCATED_BLOCKS:
            break
        moved.append(index)
        parts *= size
    return tuple(moved) if parts >= 4 else ()


def _reduction(
    x: Term,
    kept: set[str],
    sizes: dict[str, int],
    *,
    wanted: tuple[str, ...] | None,
    operands: tuple[int, ...],
    number: int,
    read: _Read | None = None,
) -> list[Step]:
    """Sum ``x``'s indices that are not ``kept``: x as (1, kept, summed) times ones (summed, 1);
    its result laid out as ``_pair``'s, for the step that reads it."""
    keep = [i for i in x.indices if i in kept]
    summed = [i for i in x.indices if i not in kept]
    best: tuple[tuple[int, bool], Step] | None = None
    want: list[Term | tuple[str, ...]] = [wanted] if wanted else []
    k_orders = _orders(summed, x)
    candidates = list(itertools.product(_orders(keep, x, *want), k_orders))
    candidates += [(m, k) for m in _ahead(keep, read) for k in k_orders]
    for m, k in candidates:
        view = _view(x, ((), m, k), sizes)
        final = wanted is not None and m != wanted
        later = math.prod(sizes[i] for i in m) if final else _unread(m, read, sizes)
        copied = view.copied + later
        score = (copied, view.strides[2] != 1)
        if best is None or score < best[0]:
            subscripts = "".join(x.indices) + "->" + "".join(m)
            step = Step(operands, number, subscripts, False, (), m, k, (), view, None, m)
            best = (score, step)
    assert best is not None
    return _split(best[1], sizes, wanted)


# A product of few outputs over a long K runs on few blocks (a scalar's last step: one), so
# K is split: S partial products as a batch, then a reduction of the S partials. Where the
# output's tiles number fewer than SPLIT_TILES, K (at least SPLIT_MIN_K) is cut in a power of
# two of parts that divides it, each at least SPLIT_MIN_PART long. (A block walks its K a tile
# of 16 at a time, about 1 us each: measured on an H200, the scalar's last product of a
# 100-vertex MIS network, K = 2048 on one block, took 139 us, a third of the whole contraction.)
SPLIT_TILES = 256
SPLIT_MIN_K = 1 << 9
SPLIT_MIN_PART = 1 << 6
# A batched product of few outputs (its batch leaves no room for a split index) is cut by moving
# K's outermost indices into its batch instead: into parts of at least RELOCATED_PART values, on
# at most RELOCATED_BLOCKS blocks; a reduction sums the parts after (see _relocated).
RELOCATED_PART = 1 << 8
RELOCATED_BLOCKS = 1 << 16


def _split(step: Step, sizes: dict[str, int], wanted: tuple[str, ...] | None) -> list[Step]:
    b, m, k = step.first.shape
    n = step.second.shape[2] if step.second is not None else 1
    tiles = -(-m // 64) * -(-n // 64)
    if b != 1 or k < SPLIT_MIN_K or tiles * 4 > SPLIT_TILES:
        return [step]
    parts = 1
    while (
        parts * 2 * tiles <= SPLIT_TILES
        and k // (parts * 2) >= SPLIT_MIN_PART
        and k % (parts * 2) == 0
    ):
        parts *= 2
    if parts < 4:
        return [step]
    part = k // parts
    # The split index: a private-use character no operand names (a batch index of the partials).
    hidden = next(c for c in map(chr, itertools.count(0xE000)) if c not in sizes)
    sizes[hidden] = parts

    def cut(view: View) -> View:
        return View(
            view.copy,
            (parts, view.shape[1], part),
            (view.strides[2] * part, view.strides[1], view.strides[2]),
        )

    def cut_second(view: View) -> View:
        return View(
            view.copy,
            (parts, part, view.shape[2]),
            (view.strides[1] * part, view.strides[1], view.strides[2]),
        )

    partials = dataclasses.replace(
        step,
        batch=(hidden, *step.batch),  # (indices of size 1, as b is)
        first=cut(step.first),
        second=cut_second(step.second) if step.second is not None else None,
        result=(hidden, *step.result),
        split=hidden,
    )
    term = Term(partials.result, contiguous([sizes[i] for i in partials.result]))
    (final,) = _reduction(
        term,
        set(step.result),
        sizes,
        wanted=wanted,
        operands=(step.number,),
        number=step.number + 1,
    )
    return [partials, final]


def planned_for(
    subscripts: str, arrays: Sequence[Any], optimize: Any, *, memory_limit: int | None = None
) -> Work[EinsumPlan]:
    """The plan of ``subscripts`` over ``arrays`` along ``optimize``: the one known for them
    (no ``memory_limit``: a plan with one is made for the free memory of now), else made off
    the event loop's thread (planning is Python, O(steps) and more)."""
    planned = known_plan(subscripts, arrays, optimize) if memory_limit is None else None
    if planned is None:
        planned = yield Offload(
            functools.partial(
                einsum_plan, subscripts, *arrays, optimize=optimize, memory_limit=memory_limit
            )
        )
    return planned
