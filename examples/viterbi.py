"""Hidden-Markov-model decoding (Viterbi) in the max-plus semiring on the GPU, checked against a
NumPy Viterbi.

    python examples/viterbi.py [--sequences 2048] [--states 64] [--steps 100] [--arch sm_90]

A batch of observation sequences is decoded at once: each step of the recursion is one max-plus
product, delta_t = (delta_{t-1} (x) log A) + log B[:, o_t], whose argmax is the back-pointer of
every (sequence, state). The most likely paths are then read back along the pointers. Without a
GPU the example compiles the kernel it would launch for ``--arch`` (default ``$AIONVRTC_ARCH``, else
sm_90) and says what it would run.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import anyio
import numpy as np

from aionvrtc import Compiler, ModuleLoadError, NoDeviceError, resolve_target, tropical


def random_hmm(
    rng: np.random.Generator, states: int, symbols: int
) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """Log start, transition (states x states) and emission (states x symbols) probabilities."""

    def log_rows(shape: tuple[int, ...]) -> np.ndarray[Any, Any]:
        p = rng.dirichlet(np.ones(shape[-1]), size=shape[:-1])
        return np.log(p).astype(np.float32)

    return log_rows((states,)), log_rows((states, states)), log_rows((states, symbols))


def viterbi_numpy(
    start: np.ndarray[Any, Any], trans: np.ndarray[Any, Any], emit: np.ndarray[Any, Any],
    obs: np.ndarray[Any, Any],
) -> np.ndarray[Any, Any]:  # fmt: skip
    """The reference: the most likely state path of every sequence (rows of ``obs``)."""
    delta = start[None, :] + emit[:, obs[:, 0]].T
    back = []
    for t in range(1, obs.shape[1]):
        scores = delta[:, :, None] + trans[None, :, :]  # (sequence, from, to)
        back.append(scores.argmax(axis=1))
        delta = scores.max(axis=1) + emit[:, obs[:, t]].T
    path = [delta.argmax(axis=1)]
    for pointers in reversed(back):
        path.append(pointers[np.arange(len(path[-1])), path[-1]])
    return np.stack(path[::-1], axis=1)


async def viterbi_gpu(
    compiler: Compiler, start: Any, trans: Any, emit: Any, obs: Any
) -> Any:  # fmt: skip
    """The same on the GPU (CuPy arrays): one max-plus product with argmax per step."""
    import cupy

    from aionvrtc import synchronize

    delta = start[None, :] + emit[:, obs[:, 0]].T
    back = []
    for t in range(1, obs.shape[1]):
        delta, pointers = await tropical.matmul(
            delta, trans, "maxplus", argmax=True, compiler=compiler
        )
        delta += emit[:, obs[:, t]].T
        back.append(pointers)
    last = delta.argmax(axis=1).astype(cupy.int32)
    path = [last]
    rows = cupy.arange(obs.shape[0])
    for pointers in reversed(back):
        path.append(pointers[rows, path[-1]])
    result = cupy.stack(path[::-1], axis=1)
    await synchronize()
    return result


async def main(sequences: int, states: int, steps: int, arch: str | None) -> None:
    # --arch, else $AIONVRTC_ARCH, else this GPU's; sm_90 on a machine without one.
    target = resolve_target(arch, default="sm_90")
    rng = np.random.default_rng()
    start, trans, emit = random_hmm(rng, states, symbols=16)
    obs = rng.integers(0, 16, size=(sequences, steps))
    async with Compiler(arch=target) as compiler:
        spec = tropical.kernel_spec(sequences, states, states, "maxplus", argmax=True)
        artifact = await compiler.compile(spec)
        name = spec.name_expressions[0]
        print(f"max-plus kernel with argmax for {target}: {name} ({artifact.kind})")
        try:
            await compiler.get(spec)  # compiled for this GPU's arch and loaded
        except (NoDeviceError, ModuleLoadError) as exc:  # no GPU here, or a driver too old
            print(
                f"no usable GPU for {target} here ({type(exc).__name__}): would decode "
                f"{sequences} sequences of {steps} steps over {states} states "
                f"({steps - 1} max-plus products)"
            )
            return
        import cupy

        started = time.perf_counter()
        want = viterbi_numpy(start, trans, emit, obs)
        numpy_s = time.perf_counter() - started
        arrays = [cupy.asarray(x) for x in (start, trans, emit, obs)]
        await viterbi_gpu(compiler, *arrays)  # warm: kernels loaded
        started = time.perf_counter()
        got = cupy.asnumpy(await viterbi_gpu(compiler, *arrays))
        gpu_s = time.perf_counter() - started
    same = float((got == want).mean())
    print(
        f"decoded {sequences} sequences x {steps} steps x {states} states: "
        f"{same:.1%} of states equal to NumPy's Viterbi; GPU {gpu_s * 1e3:.1f} ms, "
        f"NumPy {numpy_s * 1e3:.1f} ms"
    )
    if same != 1.0:
        raise SystemExit("the GPU paths differ from NumPy's")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sequences", type=int, default=2048)
    parser.add_argument("--states", type=int, default=64)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument(
        "--arch", help="compile for this arch (default: $AIONVRTC_ARCH, the GPU's, else sm_90)"
    )
    args = parser.parse_args()
    anyio.run(main, args.sequences, args.states, args.steps, args.arch)
