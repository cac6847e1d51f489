"""`aionvrtc doctor`: whether NVRTC, CUDA's headers, the driver, the GPUs and the cache dir
work, each check with a fix."""

from __future__ import annotations

import argparse
import contextlib
import platform
import shutil
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .._config import ENV_CACHE_DIR
from .._cuda_errors import map_cuda_errors
from .._exceptions import AionvrtcError, NoDeviceError
from .._store.disk import (
    PROBE_KEY,
)
from .._units import format_size
from .._version import __version__

if TYPE_CHECKING:
    pass
from ._shared import (
    Result,
    _error_line,
    _first_line,
    _not_a_folder,
    _ownership,
    _print_error,
    _tier,
    _trust,
)

__all__ = ["Check"]

Check = dict[str, str]


def _doctor(args: argparse.Namespace, console: Any) -> Result:
    checks: list[Check] = []
    probes = (
        _check_nvrtc, _check_gpus, _check_cuda_headers, _check_cache_dir, _check_free_space,
        _check_locks,
    )  # fmt: skip
    for probe in probes:
        try:
            checks.extend(probe(args))
        except Exception as exc:  # a probe that breaks is itself a finding
            if args.debug:
                raise
            detail = f"the check failed: {_error_line(exc)}"
            fix = "run aionvrtc doctor --debug for the traceback, and report it"
            checks.append(_check(probe.__name__[7:].replace("_", " "), "fail", detail, fix))
    failed = [c for c in checks if c["status"] == "fail"]
    data: dict[str, Any] = {
        "aionvrtc": __version__,
        "python": platform.python_version(),
        "nvrtc": _nvrtc_facts(),
        "driver": _driver_facts(),
        "ok": not failed,
        "checks": checks,
    }
    if failed:  # what every failing command has, for scripts
        names = ", ".join(dict.fromkeys(c["check"] for c in failed))
        data["error"] = f"checks failed: {names} (each says its fix)"
    if not args.json:
        from rich.table import Table
        from rich.text import Text

        table = Table(title=f"aionvrtc {__version__} doctor")
        for column in ("check", "status", "detail", "fix"):
            # Folded, not cut: a path wider than its column is the finding, shown whole.
            table.add_column(column, overflow="fold")
        colours = {"ok": "green", "warn": "yellow", "fail": "red"}
        for c in checks:
            status = Text(c["status"], style=colours[c["status"]])
            # Text, not markup: "aionvrtc[cu12]" in a fix is no style tag.
            table.add_row(Text(c["check"]), status, Text(c["detail"]), Text(c["fix"]))
        console.print(table)
        if failed:
            _print_error(data["error"])
    return data, 1 if failed else 0


def _check(name: str, status: str, detail: str, fix: str = "") -> Check:
    return {"check": name, "status": status, "detail": detail, "fix": fix}


def _check_nvrtc(args: argparse.Namespace) -> list[Check]:
    from .. import _cuda_versions, _nvrtc

    try:
        version = _nvrtc.version_string()
        archs = ", ".join(f"sm_{a}" for a in _nvrtc.supported_archs())
    except AionvrtcError as exc:  # no CuPy, or no NVRTC: the message ends with the fix
        detail, fix = _split_fix(str(exc), _cuda_versions.CHOOSE_EXTRA, _nvrtc._install_hint)
        return [_check("nvrtc", "fail", detail, fix)]
    library = _nvrtc._loaded_library() or "CuPy (where it loaded libnvrtc from cannot be told)"
    return [
        _check("nvrtc", "ok", f"NVRTC {version} from {library}"),
        _check("archs", "ok", archs),
        _check_min_driver(version),
        _check_driver(version),
    ]


def _check_cuda_headers(args: argparse.Namespace) -> list[Check]:
    from .. import _cuda_headers, _nvrtc

    try:
        major: int | None = _nvrtc.version()[0]
    except AionvrtcError:  # no NVRTC: the nvrtc check says so and how to install it
        major = None
    problem = _cuda_headers.locator_problem()
    if problem is not None:
        fix = _cuda_headers.LOCATOR_FIX
        return [_check("CUDA headers", "warn", f"not looked for: {problem}", fix)]
    found = {place.what: place for place in _cuda_headers.located()}
    checks = []
    for what in ("CUDA runtime", "CCCL"):
        place = found.get(what)
        name = f"{what} headers"
        if place is None:
            detail = (
                "not found: a program that includes one of them (<cuda_fp16.h>, "
                "<cooperative_groups.h>, <cuda/std/...>, CUB) fails to compile"
            )
            checks.append(_check(name, "warn", detail, _cuda_headers.install_hint(major)))
            continue
        version = f" {place.version}" if place.version else ""
        detail = f"{what}{version} in {place.path} (found via {place.found_via})"
        if (
            what == "CUDA runtime"
            and major is not None
            and place.version is not None
            and int(place.version.split(".")[0]) != major
        ):
            detail += f", with NVRTC of CUDA {major}: programs that include them may not compile"
            checks.append(_check(name, "warn", detail, _cuda_headers.other_major_hint(major)))
        else:
            checks.append(_check(name, "ok", detail))
    return checks


def _split_fix(message: str, *fixes: str | Callable[[], str]) -> tuple[str, str]:
    """``message`` (an error's "problem; fix") as (problem, fix), for the first of ``fixes``
    that ends it; the fixes themselves hold "; ", so the message cannot just be split. A fix
    given as a function is asked only when it is needed (it reads the wheels' metadata)."""
    fix = ""
    for candidate in fixes:
        fix = candidate() if callable(candidate) else candidate
        if message.endswith(f"; {fix}"):
            return message[: -len(fix) - 2], fix
    return message, fix  # the last fix, said beside the whole message


def _check_min_driver(version: str) -> Check:
    from .. import _cuda_versions, _nvrtc

    number = _nvrtc.version()[0]
    known = _cuda_versions.MAJORS.get(number)
    if known is None:
        detail = (
            f"NVRTC {version} is of CUDA {number}, which aionvrtc has no extra for: the driver "
            "its cubins need is not known here"
        )
        return _check("min driver", "warn", detail, _cuda_versions.CHOOSE_EXTRA)
    detail = (
        f"{known.min_driver}: cubins from NVRTC {version} load on NVIDIA drivers "
        f"{known.min_driver} or newer (CUDA {number}, as aionvrtc[{known.extra}] installs it)"
    )
    return _check("min driver", "ok", detail)


def _check_driver(version: str) -> Check:
    """The installed driver against NVRTC: whether it can load the cubins compiled here."""
    from .. import _cuda_versions, _nvrtc

    number = _nvrtc.version()[0]
    known = _cuda_versions.MAJORS.get(number)
    cuda, release = _cuda_versions.driver_cuda(), _cuda_versions.driver_release()
    if cuda is None and release is None:
        # Not a warning of its own: the gpus check warns that there is no driver.
        needs = f"{known.min_driver} or newer" if known else f"for CUDA {number} or newer"
        detail = (
            "none here: kernels compile (aionvrtc warm), and load on machines whose NVIDIA "
            f"driver is {needs}"
        )
        return _check("driver", "ok", detail)
    if cuda is None:  # the kernel module is loaded, and libcuda cannot be
        detail = (
            f"the NVIDIA kernel module {release} is loaded, but CUDA cannot use the driver "
            "(libcuda): kernels compile but do not load"
        )
        fix = (
            "install the driver's CUDA library (libcuda) of the same release; in a container, "
            "run it with the NVIDIA container toolkit (docker run --gpus all)"
        )
        return _check("driver", "warn", detail, fix)
    which = f"{release} (CUDA {cuda[0]}.{cuda[1]})" if release else f"CUDA {cuda[0]}.{cuda[1]}"
    if cuda[0] >= number:
        return _check("driver", "ok", f"{which}: loads the cubins of NVRTC {version}")
    detail = (
        f"{which} is older than NVRTC {version} (CUDA {number}) and cannot load the kernels "
        "compiled here"
    )
    return _check("driver", "fail", detail, _cuda_versions.driver_fix(cuda, (number, 0)))


def _nvrtc_facts() -> dict[str, Any] | None:
    """NVRTC as doctor's --json gives it: version, library, extra, the driver its cubins
    need; None where it cannot be loaded (the nvrtc check says why)."""
    from .. import _cuda_versions, _nvrtc

    try:
        number = _nvrtc.version()[0]
    except (AionvrtcError, ImportError):  # what loading CuPy and NVRTC raises
        return None
    known = _cuda_versions.MAJORS.get(number)
    return {
        "version": _nvrtc.version_string(),
        "library": _nvrtc._loaded_library(),
        "extra": known.extra if known else None,
        "min_driver": known.min_driver if known else None,
    }


def _driver_facts() -> dict[str, Any] | None:
    """The installed NVIDIA driver (its release, the CUDA it runs) or None without one."""
    from .. import _cuda_versions

    cuda, release = _cuda_versions.driver_cuda(), _cuda_versions.driver_release()
    if cuda is None and release is None:
        return None
    return {"release": release, "cuda": f"{cuda[0]}.{cuda[1]}" if cuda else None}


def _check_gpus(args: argparse.Namespace) -> list[Check]:
    compile_only = "kernels compile (aionvrtc warm) but do not load"
    fix = "none to compile only; to run kernels, a machine with an NVIDIA GPU and its driver"
    driver = 0
    try:
        with map_cuda_errors("none usable", NoDeviceError):
            try:
                import cupy
            except ModuleNotFoundError as exc:
                if exc.name != "cupy":
                    raise  # CuPy itself is broken: "none usable", with its error
                from .._cuda_versions import CHOOSE_EXTRA

                detail = "CuPy is not installed: no GPU can be found or used"
                return [_check("gpus", "warn", detail, CHOOSE_EXTRA)]

            # 0 where no driver is installed at all (CUDA's documented answer): then the
            # runtime's "driver version is insufficient" would send people to upgrade one.
            driver = cupy.cuda.runtime.driverGetVersion()
            if driver == 0:
                return [_check("gpus", "warn", f"no NVIDIA driver found: {compile_only}", fix)]
            count = cupy.cuda.runtime.getDeviceCount()
    except NoDeviceError as exc:
        if "InsufficientDriver" in str(exc):  # a driver, older than this CUDA runtime needs
            with contextlib.suppress(Exception):
                from .._cuda_versions import cuda_version, driver_fix

                number = cupy.cuda.runtime.runtimeGetVersion()
                runtime = _cuda_version(number)
                detail = (
                    f"the NVIDIA driver (CUDA {_cuda_version(driver)}) is too old for the CUDA "
                    f"runtime {runtime}: {compile_only}"
                )
                fix = driver_fix(cuda_version(driver), cuda_version(number))
                return [_check("gpus", "warn", detail, fix)]
        return [_check("gpus", "warn", f"{_first_line(str(exc))}: {compile_only}", fix)]
    if count == 0:
        return [_check("gpus", "warn", f"none: {compile_only}", fix)]
    rows = []
    for device in range(count):
        props = cupy.cuda.runtime.getDeviceProperties(device)
        name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
        arch = f"sm_{props['major']}{props['minor']}"
        detail = f"{name}, {arch}, driver CUDA {_cuda_version(driver)}"
        rows.append(_check(f"gpu {device}", "ok", detail))
    return rows


def _cuda_version(number: int) -> str:
    from .._cuda_versions import cuda_version

    return "{}.{}".format(*cuda_version(number))


def _check_cache_dir(args: argparse.Namespace) -> list[Check]:
    tier = _tier(args)
    root = tier.root
    blocker = _not_a_folder(root)
    if blocker is not None:
        where = "" if blocker == root else f", so {root} cannot be made"
        detail = f"{blocker} is not a folder{where}: nothing can be cached there"
        fix = f"point {ENV_CACHE_DIR} (or --cache-dir) at a folder; a missing one is made"
        return [_check("cache dir", "fail", detail, fix)]
    # Makes the folders as the tier does (0700, or 2770 shared); it may find the tree untrusted.
    failure = tier.probe_write() if tier.trusted else None
    if tier.trust_problem is not None:
        damage = tier.trust_problem
        detail = (
            f"{root} ({_ownership(root)}) is not trusted, so it is neither read nor written: "
            f"{damage.path} is {damage.problem}"
        )
        return [_check("cache dir", "fail", detail, damage.fix)]
    if failure is None:
        return [_check("cache dir", "ok", f"{tier.dir}: {_trust(tier)}; writable")]
    if root.is_dir():
        detail = (
            f"{tier.dir}: {_trust(tier)}; not writable by this user ({failure}): entries are "
            "read from it, new kernels are compiled and kept in memory"
        )
        fix = f"none if read-only on purpose; else point {ENV_CACHE_DIR} at a folder you own"
        return [_check("cache dir", "warn", detail, fix)]
    fix = f"point {ENV_CACHE_DIR} (or --cache-dir) at a folder this user can make and write"
    return [_check("cache dir", "fail", f"cannot make {tier.dir}: {failure}", fix)]


def _check_free_space(args: argparse.Namespace) -> list[Check]:
    tier = _tier(args)
    folder = tier.dir
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    free = shutil.disk_usage(folder).free
    detail = f"{format_size(free)} free, cache limit {format_size(tier.limit)}"
    if free < 64 << 20:
        return [_check("free space", "fail", detail, f"free space on the disk of {folder}")]
    if free < tier.limit:
        fix = "lower the limit (AIONVRTC_DISK_LIMIT) or free space: a full disk stops writes"
        return [_check("free space", "warn", detail, fix)]
    return [_check("free space", "ok", detail)]


def _check_locks(args: argparse.Namespace) -> list[Check]:
    tier = _tier(args)
    try:
        import fcntl  # noqa: F401
    except ImportError:
        return [_check("file locks", "warn", "not POSIX: processes may compile a kernel twice")]
    if not tier.trusted or tier.probe_write() is not None:
        return [_check("file locks", "ok", "not used: nothing is written to this cache dir")]
    # As a compile does: the key's lock, and its entry written under it (then both removed).
    with tier.lock(PROBE_KEY) as locked:
        tier.probe_write()
    if not tier.locking:
        detail = "flock fails here: processes may each compile a kernel once"
        fix = "put the cache on a local file system (AIONVRTC_CACHE_DIR)"
        return [_check("file locks", "warn", detail, fix)]
    if not locked:
        fix = f"point {ENV_CACHE_DIR} (or --cache-dir) at a folder this user can write"
        return [_check("file locks", "fail", f"cannot create a lock file in {tier.dir}", fix)]
    return [_check("file locks", "ok", "flock works: one compile per kernel across processes")]
