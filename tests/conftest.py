from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from aionvrtc import KernelSpec

from .support import FakeDriver, has_gpu, make_spec
from .support.seeds import seeded


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


@pytest.fixture
def other_users_dir() -> Iterator[Path]:
    """A folder under /tmp that uid 65534 can reach (pytest's tmp_path is root's, 0700)."""
    folder = Path(tempfile.mkdtemp(prefix="aionvrtc-hostile-"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if has_gpu():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU: run `pytest -m gpu` on a machine with one")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


# -- the GPU's loader, faked: load faults ---------------------------------------------------


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
    return seeded(request.node.nodeid)
