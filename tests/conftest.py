from __future__ import annotations

import itertools
import json
import os
import random
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from aionvrtc import FORMAT_VERSION, KernelSpec

# The folder of a cache dir that holds this format's entries.
ENTRIES = f"v{FORMAT_VERSION}"

_serial = itertools.count()
# A process-unique salt: NVRTC 13 keeps a cross-process cache of compiled programs
# (~/.nv/ComputeCache), and tests that count compiles or need a slow compile must never see
# another run's kernel.
_SALT = f"{os.getpid()}_{id(_serial)}"

TEMPLATE = """
template <typename T>
__global__ void scale_{tag}(T* x, T factor, int n) {{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= factor;
}}
"""


def make_spec(tag: str | None = None, **kwargs: object) -> KernelSpec:
    """A tiny templated kernel, distinct per call unless ``tag`` is given."""
    tag = tag or f"k{_SALT}_{next(_serial)}"
    kwargs.setdefault("name_expressions", (f"scale_{tag}<float>",))
    return KernelSpec(TEMPLATE.format(tag=tag), **kwargs)  # type: ignore[arg-type]


@pytest.fixture
def spec_factory() -> Callable[..., KernelSpec]:
    return make_spec


@pytest.fixture
def cache_dir(tmp_path: Path) -> Path:
    return tmp_path / "cache"


@pytest.fixture(autouse=True)
def _no_user_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    # Never touch the real user cache dir from tests.
    old = os.environ.get("AIONVRTC_CACHE_DIR")
    os.environ["AIONVRTC_CACHE_DIR"] = str(tmp_path_factory.mktemp("default-cache"))
    yield
    if old is None:
        os.environ.pop("AIONVRTC_CACHE_DIR", None)
    else:
        os.environ["AIONVRTC_CACHE_DIR"] = old


ROOT = Path(__file__).resolve().parent.parent


def run_python(code: str, *, timeout: float = 120, env: dict[str, str] | None = None) -> str:
    """Run ``code`` in a fresh interpreter (the project root importable, so ``tests.*`` too,
    with ``env`` added to the environment); return its stdout. A child that outlives
    ``timeout`` fails the test instead of hanging the suite."""
    path = os.pathsep.join([str(ROOT), *sys.path])
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout,
        check=False, cwd=ROOT, env={**os.environ, "PYTHONPATH": path, **(env or {})},
    )  # fmt: skip
    if proc.returncode != 0:
        raise AssertionError(f"child failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return proc.stdout


@pytest.fixture
def read_only(tmp_path: Path) -> Iterator[Callable[[Path], Path]]:
    """Make a folder read-only for real: a read-only bind mount as root (root ignores modes),
    file modes otherwise. Returns the read-only view of the folder."""
    mounts: list[Path] = []
    chmods: list[Path] = []

    def make(folder: Path) -> Path:
        if os.geteuid() != 0:
            for path in [folder, *folder.rglob("*")]:
                if path.is_dir():
                    path.chmod(0o555)
                    chmods.append(path)
            return folder
        view = tmp_path / f"ro-view-{len(mounts)}"
        view.mkdir()
        for args in (["--bind", str(folder), str(view)], ["-o", "remount,bind,ro", str(view)]):
            done = subprocess.run(["mount", *args], capture_output=True, text=True, check=False)
            if done.returncode != 0:
                pytest.skip(f"running as root and cannot bind-mount read-only: {done.stderr}")
            if args[0] == "--bind":
                mounts.append(view)
        return view

    yield make
    for view in mounts:
        subprocess.run(["umount", str(view)], check=False)
    for path in chmods:
        path.chmod(0o700)


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    """Every async test of the core runs under asyncio and under trio."""
    return str(request.param)


# -- a second user: trust checks --------------------------------------------------------------

NOBODY = 65534  # uid and gid of a user that owns nothing here
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to chown to another user")


@pytest.fixture
def other_users_dir() -> Iterator[Path]:
    """A folder under /tmp that uid 65534 can reach (pytest's tmp_path is root's, 0700)."""
    folder = Path(tempfile.mkdtemp(prefix="aionvrtc-hostile-"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def as_other_user(work: Callable[[], dict[str, Any]], *, timeout: float = 60) -> dict[str, Any]:
    """Run ``work`` in a forked child as uid and gid 65534 (as root; otherwise as this user,
    who is then not root either); its result comes back as JSON through a pipe. The child
    cannot read /root, where the interpreter's library lives: what ``work`` needs must be
    imported, and used once, before."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: it must never return into pytest
        payload = b'{"error": "the child failed before it could report"}'
        try:
            os.close(read_end)
            if os.geteuid() == 0:
                os.setgroups([])
                os.setgid(NOBODY)
                os.setuid(NOBODY)
            payload = json.dumps(work()).encode()
        except BaseException as exc:
            payload = json.dumps({"error": repr(exc)}).encode()
        finally:
            os.write(write_end, payload)
            os._exit(0)
    os.close(write_end)
    chunks = []
    deadline = time.monotonic() + timeout
    try:
        while True:
            ready, _, _ = select.select([read_end], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                os.kill(pid, signal.SIGKILL)
                pytest.fail(f"the child as uid {NOBODY} did not finish in {timeout} s")
            chunk = os.read(read_end, 1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(read_end)
        os.waitpid(pid, 0)
    result: dict[str, Any] = json.loads(b"".join(chunks))
    assert "error" not in result, result["error"]
    return result


# What CuPy's CUDADriverError says for the statuses the tests raise: cuGetErrorString's words
# after the status's name. Those of 2, 200, 209, 218, 222 and 700 are what cuModuleLoadData
# returned on an H100 (driver 580, CuPy 14.2) for a full GPU, a damaged cubin, a cubin for
# another arch, broken PTX, PTX from a newer toolchain and a context after a kernel's fault.
DRIVER_ERRORS = {
    "CUDA_ERROR_OUT_OF_MEMORY": (2, "out of memory"),
    "CUDA_ERROR_NOT_INITIALIZED": (3, "initialization error"),
    "CUDA_ERROR_INVALID_IMAGE": (200, "device kernel image is invalid"),
    "CUDA_ERROR_INVALID_CONTEXT": (201, "invalid device context"),
    "CUDA_ERROR_NO_BINARY_FOR_GPU": (
        209, "no kernel image is available for execution on the device"
    ),
    "CUDA_ERROR_INVALID_PTX": (218, "a PTX JIT compilation failed"),
    "CUDA_ERROR_JIT_COMPILER_NOT_FOUND": (221, "PTX JIT compiler library not found"),
    "CUDA_ERROR_UNSUPPORTED_PTX_VERSION": (
        222, "the provided PTX was compiled with an unsupported toolchain."
    ),
    "CUDA_ERROR_ILLEGAL_ADDRESS": (700, "an illegal memory access was encountered"),
    "CUDA_ERROR_UNKNOWN": (999, "unknown error"),
}  # fmt: skip


def driver_error(name: str = "CUDA_ERROR_INVALID_IMAGE") -> Exception:
    """CuPy's CUDADriverError for status ``name``, as the driver raises it: made by CuPy where
    libcuda is there to name the status, else by hand as CuPy makes it (``status``, and the
    text "NAME: description")."""
    import cupy

    kind = cupy.cuda.driver.CUDADriverError
    status, text = DRIVER_ERRORS[name]
    try:
        return kind(status)  # type: ignore[no-any-return]
    except RuntimeError:  # "CuPy failed to load libcuda.so.1"
        error = kind.__new__(kind)
        RuntimeError.__init__(error, f"{name}: {text}")
        error.status = status
        return error  # type: ignore[no-any-return]


def has_gpu() -> bool:
    try:
        import cupy

        return bool(cupy.cuda.runtime.getDeviceCount())
    except Exception:
        return False


SLOW_TEMPLATE = """
__global__ void slow_{salt}_{tag}(float* x) {{
    float a = x[threadIdx.x];
    #pragma unroll
    for (int i = 0; i < {depth}; ++i) a = sinf(a) * 1.0001f + (float)(i ^ {tag});
    x[threadIdx.x] = a;
}}
"""


def make_slow_spec(depth: int = 30) -> KernelSpec:
    """A kernel that takes NVRTC a few hundred milliseconds, for overlap and race tests."""
    # Salted per process: NVRTC 13's cross-process cache of compiled programs (~/.nv) would
    # make a kernel compiled by an earlier run fast.
    return KernelSpec(SLOW_TEMPLATE.format(tag=next(_serial), depth=depth, salt=_SALT))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if has_gpu():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU: run `pytest -m gpu` on a machine with one")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


# -- the GPU's loader, faked: load faults ---------------------------------------------------


class FakeDriver:
    """The GPU this CPU lacks, at CuPy's boundary: device 0, compute capability 9.0, whose
    cuModuleLoadData (CuPy's ``Module.load``) raises the status ``fault`` while it is set (a
    full GPU, a broken context, or every image refused), or ``refused[image]`` for an image
    it refuses, and otherwise takes the image. Faults that no CPU can produce, and no GPU on
    demand: the one place the tests replace a real part. Everything else (NVRTC, the tiers,
    the Compiler) is real."""

    def __init__(self) -> None:
        self.fault: str | None = None
        self.refused: dict[bytes, str] = {}
        self.tries = 0  # images given to cuModuleLoadData
        self.loaded: list[bytes] = []  # images it took

    def load(self, image: bytes) -> None:
        self.tries += 1
        status = self.fault or self.refused.get(image)
        if status is not None:
            raise driver_error(status)
        self.loaded.append(image)


@pytest.fixture
def gpu(monkeypatch: pytest.MonkeyPatch) -> FakeDriver:
    import contextlib

    import cupy
    from cupy.cuda import function

    from aionvrtc import _cuda

    driver = FakeDriver()

    class Module:  # CuPy's, whose load() is the driver's
        def load(self, image: bytes) -> None:
            driver.load(image)

    monkeypatch.setattr(_cuda, "check_device", lambda device: (9, 0))
    monkeypatch.setattr(_cuda, "current_device", lambda: 0)
    monkeypatch.setattr(_cuda, "device_count", lambda: 1)
    monkeypatch.setattr(_cuda, "device_ready", lambda device: True)
    monkeypatch.setattr(cupy.cuda, "Device", lambda device: contextlib.nullcontext())
    monkeypatch.setattr(function, "Module", Module)
    return driver


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> np.random.Generator:
    """A generator from a fresh seed, printed (or from TROPICAL_TEST_SEED, to repeat a run)."""
    seed = int(os.environ.get("TROPICAL_TEST_SEED") or random.SystemRandom().randrange(1 << 63))
    print(f"{request.node.nodeid}: seed {seed} (TROPICAL_TEST_SEED={seed} draws it again)")
    return np.random.default_rng(seed)
