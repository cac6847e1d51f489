"""The disk tier at 1,000, 10,000 and 50,000 entries (4 KB each, written through the tier), on
this machine's disk, files in the page cache:

    python benchmarks/disk_tier.py --machine "2 vCPUs" [--sizes 1000 10000 50000]
        [--runs 5] [--no-before]

Measures, medians of --runs runs: a write (the first of a new DiskTier, which the code before
the index scanned the cache dir for, and one after it), the write that takes the cache over its
limit (and the eviction behind it, and the longest read hit while it ran), a read hit,
`aionvrtc cache ls --json`, `cache info --json` and `cache prune` (the CLI's main() in this
process, stdout to /dev/null; `ls --json` also as a process of its own), and the handoff of a
key's lock from one process to another (release there -> held here, over --handoffs rounds).
"before": the same with the disk tier and CLI of git HEAD (or --before REV), side by side
(--no-before skips it). The cyclic garbage collector is on, as it is in services. Writes
benchmarks/results/disk_tier-<machine slug>.{json,md}.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib.util
import os
import platform
import secrets
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import aionvrtc
from aionvrtc import Artifact
from aionvrtc import _cli as cli_now
from aionvrtc._artifact import encode
from aionvrtc._store import disk as disk_now
from benchmarks._results import RESULTS, write

ROOT = Path(__file__).resolve().parent.parent
KEY = "ab" * 32  # the key whose lock is handed over

# A process that takes the key's lock, says so, and lets go when told, printing when it did
# (time.monotonic(): one clock for every process of the host).
HOLDER = r"""
import sys, time
from aionvrtc._store.disk import DiskTier
tier = DiskTier(sys.argv[1])
for line in sys.stdin:
    if line.strip() == "stop":
        break
    lock = tier.wait_lock(sys.argv[2])
    print("held" if lock.held else "not held", flush=True)
    sys.stdin.readline()
    released = time.monotonic()
    lock.release()
    print(released, flush=True)
"""


def artifact(n: int) -> Artifact:
    """A 4 KB entry under a random key."""
    return Artifact(
        key=secrets.token_hex(32), kind="cubin", image=b"\x7fELF" + os.urandom(3500),
        arch="sm_90", nvrtc_version="13.5", lowered_names={f"kernel_{n}<float>": f"_Z6k_{n}"},
    )  # fmt: skip


def fill(root: Path, count: int, start: int) -> list[str]:
    """Write ``count`` entries through the tier (without a limit to speak of); their keys."""
    tier = disk_now.DiskTier(root, limit=1 << 40)
    keys = []
    for n in range(start, start + count):
        art = artifact(n)
        assert tier.write(art)
        keys.append(art.key)
    assert tier.wait_maintenance(600)
    return keys


def on_disk(root: Path) -> int:
    """Bytes of the entries, by a walk of the folders (not the tier's)."""
    return sum(e.size for e in disk_now.DiskTier(root).survey().entries)


def seconds(call: Callable[..., object], *args: Any, **kwargs: Any) -> float:
    """How long ``call(*args, **kwargs)`` took (the arguments made before the clock starts)."""
    started = time.perf_counter()
    call(*args, **kwargs)
    return time.perf_counter() - started


# -- the code before: git HEAD's disk tier and CLI, as modules beside the current ones -------


# The disk tier's modules, each before those that import it.
_DISK_MODULES = ("_index", "_trust", "_disk_base", "_survey", "_upkeep", "disk")


def before(rev: str = "HEAD") -> tuple[ModuleType, ModuleType | None] | None:
    """``rev``'s disk tier (each of its modules that ``rev`` has, as
    aionvrtc._store.<module>_before, importing each other's copies) and, where the CLI was one
    module, its CLI (aionvrtc._cli_before, made to use the old tier); None if git has no
    ``rev``. A revision whose CLI is a package has no CLI measured before (its rows say "-")."""
    loaded: list[str] = []
    disk: ModuleType | None = None
    for name in _DISK_MODULES:
        edits = {f"from .{other} import": f"from .{other}_before import" for other in loaded}
        try:
            module = _load(f"aionvrtc._store.{name}_before", f"src/aionvrtc/_store/{name}.py",
                           edits, rev)  # fmt: skip
        except (OSError, subprocess.CalledProcessError):
            if name == "disk":
                return None  # no such revision, or no git
            continue  # a module that revision did not have
        loaded.append(name)
        disk = module
    assert disk is not None
    try:
        cli: ModuleType | None = _load(
            "aionvrtc._cli_before", "src/aionvrtc/_cli.py",
            {"from ._store.disk import": "from ._store.disk_before import"}, rev,
        )  # fmt: skip
    except subprocess.CalledProcessError:
        cli = None
    return disk, cli


def _load(name: str, path: str, edits: dict[str, str], rev: str) -> ModuleType:
    source = subprocess.run(
        ["git", "show", f"{rev}:{path}"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    for old, new in edits.items():
        source = source.replace(old, new)
    spec = importlib.util.spec_from_loader(name, loader=None)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    module.__package__ = name.rpartition(".")[0]
    sys.modules[name] = module
    exec(compile(source, f"{rev}:{path}", "exec"), module.__dict__)
    return module


# -- the measurements -------------------------------------------------------------------------


def writes(disk: ModuleType, root: Path, runs: int, start: int) -> dict[str, float]:
    """The first write of a new DiskTier (median over ``runs`` tiers), and the median of 50
    writes after it."""
    first, later = [], []
    for run in range(runs):
        tier = disk.DiskTier(root, limit=1 << 40)
        first.append(seconds(tier.write, artifact(start + run)))
    tier = disk.DiskTier(root, limit=1 << 40)
    for n in range(50):
        later.append(seconds(tier.write, artifact(start + runs + n)))
    _settle(tier)
    return {"first_write_s": statistics.median(first), "write_s": statistics.median(later)}


def eviction(
    disk: ModuleType, root: Path, runs: int, start: int, keys: list[str]
) -> dict[str, Any]:
    """The write that takes the cache over its limit (the limit set at the bytes there are);
    the eviction, down to the low water, done (in the background, or in the write itself);
    the longest read hit meanwhile, by another thread on the same tier, of entries written
    last. The entries evicted are written again between runs."""
    out: dict[str, list[float]] = {"evicting_write_s": [], "evicted_by_s": [], "read_max_s": []}
    for run in range(runs):
        count = len(disk_now.DiskTier(root).scan())
        tier = disk.DiskTier(root, limit=on_disk(root))
        reads: list[float] = []
        stop = threading.Event()
        reader = threading.Thread(target=_read_loop, args=(tier, keys[-20:], reads, stop))
        reader.start()
        started = time.perf_counter()
        out["evicting_write_s"].append(seconds(tier.write, artifact(start + run)))
        _settle(tier)
        out["evicted_by_s"].append(time.perf_counter() - started)
        stop.set()
        reader.join()
        out["read_max_s"].append(max(reads))
        keys += fill(root, count + 1 - len(disk_now.DiskTier(root).scan()), start + 1000 * run)
    return {name: statistics.median(values) for name, values in out.items()}


# Reads hits on the cache dir argv[1] of the keys on stdin's first line until a second line
# comes, then prints the longest read in seconds: a reader that shares no GIL with the eviction.
READER = r"""
import select, sys, time
from aionvrtc._store.disk import DiskTier
tier = DiskTier(sys.argv[1])
keys = sys.stdin.readline().split()
print("reading", flush=True)
longest = 0.0
while not select.select([sys.stdin], [], [], 0)[0]:
    for key in keys:
        started = time.perf_counter()
        assert tier.read(key) is not None
        longest = max(longest, time.perf_counter() - started)
print(longest, flush=True)
"""


def eviction_floor(root: Path, runs: int, start: int, keys: list[str]) -> float:
    """The longest read hit during the eviction of ``eviction`` (the code now), by a reader in
    another process, which shares no GIL with it: what the file system and the machine alone
    cost a read meanwhile. Median of ``runs``."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), *sys.path])}
    longest = []
    for run in range(runs):
        count = len(disk_now.DiskTier(root).scan())
        tier = disk_now.DiskTier(root, limit=on_disk(root))
        reader = subprocess.Popen(
            [sys.executable, "-c", READER, str(root)], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, text=True, env=env,
        )  # fmt: skip
        assert reader.stdin is not None
        assert reader.stdout is not None
        reader.stdin.write(" ".join(keys[-20:]) + "\n")
        reader.stdin.flush()
        assert reader.stdout.readline().strip() == "reading"
        assert tier.write(artifact(start + run))
        _settle(tier)
        out, _ = reader.communicate("stop\n", timeout=60)
        longest.append(float(out))
        keys += fill(root, count + 1 - len(disk_now.DiskTier(root).scan()), start + 1000 * run)
    return statistics.median(longest)


def _read_loop(tier: Any, keys: list[str], took: list[float], stop: threading.Event) -> None:
    """Read hits on ``tier`` (the writer's: one tier serves a process's threads) until
    ``stop``."""
    while not stop.is_set():
        for key in keys:
            took.append(seconds(tier.read, key))


def _settle(tier: Any) -> None:
    """Wait for a tier's background eviction (the code before has none)."""
    wait = getattr(tier, "wait_maintenance", None)
    if wait is not None:
        assert wait(600)


def read_hits(disk: ModuleType, root: Path, keys: list[str], runs: int) -> float:
    """A read hit: of entries still there (earlier steps pruned and evicted the oldest)."""
    tier = disk.DiskTier(root)
    there = {entry.key for entry in disk_now.DiskTier(root).scan()}
    took = []
    for key in [key for key in keys if key in there][: 40 * runs]:
        started = time.perf_counter()
        assert tier.read(key) is not None
        took.append(time.perf_counter() - started)
    return statistics.median(took)


def commands(cli: ModuleType, root: Path, runs: int, start: int) -> dict[str, float]:
    """`cache ls --json`, `cache info --json` and `cache prune` (of 1% of the bytes: the
    entries pruned are written again between runs), in this process."""
    out: dict[str, list[float]] = {"ls_json_s": [], "info_s": [], "prune_s": []}
    for run in range(runs):
        out["ls_json_s"].append(_main(cli, root, "ls", "--json"))
        out["info_s"].append(_main(cli, root, "info", "--json"))
        count = len(disk_now.DiskTier(root).scan())
        keep = str(int(on_disk(root) * 0.99))
        out["prune_s"].append(_main(cli, root, "prune", "--max-size", keep))
        fill(root, count - len(disk_now.DiskTier(root).scan()), start + 1000 * run)
    medians: dict[str, float] = {name: statistics.median(values) for name, values in out.items()}
    # Once each, as they remove (and write back) many entries: by age, the tenth least recently
    # used made two days old; by size, to half the bytes.
    count = len(disk_now.DiskTier(root).scan())
    oldest = sorted(disk_now.DiskTier(root).scan(), key=lambda entry: entry.last_used)
    two_days_ago = time.time() - 2 * 86_400
    for entry in oldest[: count // 10]:
        os.utime(entry.path, (two_days_ago, two_days_ago))
    with unlinking() as spent:
        medians["prune_age_s"] = _main(cli, root, "prune", "--older-than", "1d")
    medians["prune_age_unlink_s"] = spent[0]
    fill(root, count - len(disk_now.DiskTier(root).scan()), start + 900_000)
    with unlinking() as spent:
        medians["prune_half_s"] = _main(cli, root, "prune", "--max-size", str(on_disk(root) // 2))
    medians["prune_half_unlink_s"] = spent[0]
    fill(root, count - len(disk_now.DiskTier(root).scan()), start + 950_000)
    return medians


@contextlib.contextmanager
def unlinking() -> Iterator[list[float]]:
    """The seconds spent inside ``os.unlink`` meanwhile: the file system's share of a prune
    (on a disk mounted with online discard, an entry written long ago costs far more to
    remove than one just written)."""
    spent = [0.0]
    real = os.unlink

    def timed(*args: Any, **kwargs: Any) -> None:
        started = time.perf_counter()
        try:
            real(*args, **kwargs)
        finally:
            spent[0] += time.perf_counter() - started

    os.unlink = timed
    try:
        yield spent
    finally:
        os.unlink = real


def _main(cli: ModuleType, root: Path, *args: str) -> float:
    """The CLI's main() in this process, its output to /dev/null."""
    with open(os.devnull, "w") as null, contextlib.redirect_stdout(null):
        return seconds(cli.main, ["cache", *args, "--cache-dir", str(root)])


def ls_process(root: Path, runs: int) -> float:
    """`python -m aionvrtc cache ls --json` as a process of its own (its start included)."""
    command = [sys.executable, "-m", "aionvrtc", "cache", "ls", "--json", "--cache-dir", str(root)]
    took = [
        seconds(subprocess.run, command, stdout=subprocess.DEVNULL, check=True, cwd=ROOT)
        for _ in range(runs)
    ]
    return statistics.median(took)


def handoff(disk: ModuleType, root: Path, rounds: int) -> dict[str, float]:
    """Seconds from a holder's release (in another process) to the lock held here; this
    process waits in a thread that is in its wait before the release."""
    late = []
    with _holder(root) as (send, receive):
        tier = disk.DiskTier(root)
        for _ in range(rounds):
            send("take")
            assert receive() == "held"
            held: list[float] = []
            waiter = threading.Thread(target=_wait_for, args=(disk, tier, held))
            waiter.start()
            time.sleep(0.02)  # the waiter is in its wait now
            send("release")
            released = float(receive())
            waiter.join()
            late.append(held[0] - released)
        send("stop")
    late.sort()
    return {
        "handoff_median_s": statistics.median(late),
        "handoff_p90_s": late[int(0.9 * (len(late) - 1))],
        "handoff_max_s": late[-1],
    }


def _wait_for(disk: ModuleType, tier: Any, held: list[float]) -> None:
    if hasattr(tier, "wait_lock"):
        lock = tier.wait_lock(KEY)
        held.append(time.monotonic())
        assert lock.held
        lock.release()
        return
    with tier.lock(KEY) as locked:  # the code before: a context manager that polls
        held.append(time.monotonic())
        assert locked


@contextlib.contextmanager
def _holder(root: Path) -> Iterator[tuple[Callable[[str], None], Callable[[], str]]]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), *sys.path])}
    child = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(root), KEY], stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    assert child.stdin is not None
    assert child.stdout is not None
    stdin, stdout = child.stdin, child.stdout

    def send(line: str) -> None:
        stdin.write(line + "\n")
        stdin.flush()

    def receive() -> str:
        return stdout.readline().strip()

    try:
        yield send, receive
    finally:
        child.kill()
        child.wait()


# -- a run ------------------------------------------------------------------------------------


def measure(
    size: int, runs: int, handoffs: int, old: tuple[ModuleType, ModuleType | None] | None
) -> dict[str, Any]:
    """Every figure at ``size`` entries, of the code now and (``old``) before, on one cache
    dir built once."""
    with tempfile.TemporaryDirectory(prefix=f"disk-tier-{size}-") as scratch:
        root = Path(scratch) / "cache"
        started = time.perf_counter()
        keys = fill(root, size, 0)
        built = time.perf_counter() - started
        print(f"{size} entries written in {built:.1f} s", flush=True)
        result: dict[str, Any] = {"entries": size, "build_s": built}
        versions: dict[str, tuple[ModuleType, ModuleType | None]] = {"now": (disk_now, cli_now)}
        if old is not None:
            versions["before"] = old
        for offset, (name, (disk, cli)) in enumerate(versions.items(), start=1):
            serial = 10_000_000 * offset  # keys written by each step come from its own range
            figures: dict[str, Any] = {}
            figures.update(writes(disk, root, runs, serial))
            figures["read_hit_s"] = read_hits(disk, root, keys, runs)
            figures.update(eviction(disk, root, runs, serial + 1_000_000, keys))
            if cli is not None:
                figures.update(commands(cli, root, runs, serial + 2_000_000))
            if name == "now":
                figures["ls_json_process_s"] = ls_process(root, runs)
                floor_keys = serial + 3_000_000
                figures["read_max_other_process_s"] = eviction_floor(root, runs, floor_keys, keys)
            figures.update(handoff(disk, root / "locks", handoffs))
            result[name] = figures
            print(f"{size} {name}: {figures}", flush=True)
        return result


ROWS = [
    ("first write of a new DiskTier", "first_write_s"),
    ("a write", "write_s"),
    ("the write that takes it over the limit", "evicting_write_s"),
    ("... until evicted to the low water", "evicted_by_s"),
    ("longest read hit during that eviction", "read_max_s"),
    ("... by a reader in another process (no GIL shared)", "read_max_other_process_s"),
    ("a read hit", "read_hit_s"),
    ("`cache ls --json` (main() in-process)", "ls_json_s"),
    ("`cache ls --json` (a process: start included)", "ls_json_process_s"),
    ("`cache info --json` (main() in-process)", "info_s"),
    ("`cache prune` of 1% (main() in-process)", "prune_s"),
    ("`cache prune --older-than` of the tenth unused for 2 days (one run)", "prune_age_s"),
    ("... of which inside `os.unlink`", "prune_age_unlink_s"),
    ("`cache prune --max-size` to half the bytes (one run)", "prune_half_s"),
    ("... of which inside `os.unlink`", "prune_half_unlink_s"),
    ("lock handoff between processes, median", "handoff_median_s"),
    ("lock handoff, p90", "handoff_p90_s"),
    ("lock handoff, max", "handoff_max_s"),
]


def _ms(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value * 1e3:.2f} ms" if value < 0.1 else f"{value * 1e3:.0f} ms"


def markdown(facts: dict[str, Any], results: list[dict[str, Any]]) -> str:
    sizes = [r["entries"] for r in results]
    before = any("before" in r for r in results)
    head = ["operation"]
    for size in sizes:
        head += [f"{size:,}"] + ([f"{size:,} before"] if before else [])
    lines = [
        f"# Disk tier on {facts['machine']}",
        "",
        f"{facts['cpus']} CPUs, Python {facts['python']} (garbage collector on), aionvrtc "
        f"{facts['aionvrtc']}, {facts['date']}; entries of {facts['entry_bytes']} bytes written "
        f"through the tier, in the page cache. Medians of {facts['runs']} runs; the handoff "
        f'over {facts["handoffs"]} rounds. "before": {facts["before"]}\'s disk tier and CLI, '
        "side by side in the same process.",
        "",
        "| " + " | ".join(head) + " |",
        "| " + " | ".join(["---"] + ["---:"] * (len(head) - 1)) + " |",
    ]
    for label, name in ROWS:
        cells = [label]
        for r in results:
            cells.append(_ms(r["now"].get(name)))
            if before:
                cells.append(_ms(r.get("before", {}).get(name)))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--machine", required=True, help="a name for this machine")
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000, 10_000, 50_000])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--handoffs", type=int, default=60)
    parser.add_argument("--no-before", action="store_true", help="skip the code before")
    parser.add_argument("--before", default="HEAD", help="the git revision measured as before")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    assert gc.isenabled()
    old = None if args.no_before else before(args.before)
    results = [measure(size, args.runs, args.handoffs, old) for size in args.sizes]
    facts = {
        "machine": args.machine,
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "aionvrtc": aionvrtc.__version__,
        "date": time.strftime("%Y-%m-%d"),
        "gc": "on",
        "runs": args.runs,
        "handoffs": args.handoffs,
        "entry_bytes": len(encode(artifact(0))),
        "before": None if old is None else f"git {args.before}",
    }
    write(args.out, "disk_tier", label=args.machine, facts=facts, results=results,
          table=markdown(facts, results))  # fmt: skip


if __name__ == "__main__":
    main()
