"""A Compiler's statistics as Prometheus metrics (``pip install 'aionvrtc[metrics]'``).

    from prometheus_client import start_http_server
    from aionvrtc.metrics import register
    register(compiler)           # or register(compiler, registry=my_registry, name="gemm")
    start_http_server(9100)

Values are read from ``compiler.stats()`` at each scrape, so nothing is counted twice and an idle
service costs nothing between scrapes.
"""

from __future__ import annotations

from collections.abc import Iterator
from operator import attrgetter
from typing import TYPE_CHECKING, Any

from ._compiler import Compiler, CompilerStats

if TYPE_CHECKING:
    from prometheus_client.registry import CollectorRegistry

__all__ = ["CompilerCollector", "register"]

# (stats field, dotted into the tiers' own stats; metric name without the prefix; help):
# counters, then gauges.
_COUNTERS = (
    ("requests", "requests", "compile() and get() calls, those refused aside (rejected)"),
    ("memory.hits", "memory_hits", "requests served from the in-memory map"),
    ("disk.hits", "disk_hits", "requests served from the disk cache"),
    ("compiles", "compiles", "successful NVRTC compiles"),
    ("joined", "joined", "requests that shared another request's compile"),
    ("errors", "errors", "requests that raised"),
    ("rejected", "rejected", "requests refused because max_queued kernels were waiting"),
    ("hot_compiles", "hot_compiles", "compiles a request waited for while serving"),
    ("compile_seconds", "compile_seconds", "seconds spent in NVRTC"),
    ("disk.corrupt_dropped", "corrupt_dropped", "disk entries that failed verification"),
    ("memory.evictions", "memory_evictions", "entries evicted from memory"),
    ("disk.evictions", "disk_evictions", "entries evicted from disk"),
    ("disk.write_failures", "disk_write_failures", "disk writes that failed"),
    ("remote.hits", "remote_hits", "requests served from the remote tier"),
    ("remote.misses", "remote_misses", "remote tier lookups that found nothing"),
    ("remote.rejected", "remote_rejected", "remote entries refused: unsigned, bad or corrupt"),
    ("remote.errors", "remote_errors", "remote tier calls that failed"),
    ("remote.lock_waits", "remote_lock_waits", "compiles that waited for another host's"),
    ("remote.foreign_locks", "remote_foreign_locks", "remote compile locks ignored as foreign"),
)
_GAUGES = (
    ("queued", "queue_depth", "jobs looking up or waiting for a compile slot"),
    ("in_flight", "compiles_in_flight", "jobs holding a compile slot"),
    ("waiting", "lock_waits_in_flight", "jobs waiting for another process's or host's lock"),
    ("memory.entries", "memory_entries", "entries in the in-memory map"),
    ("memory.bytes", "memory_bytes", "bytes in the in-memory map"),
    ("disk.writable", "disk_writable", "1 while the disk cache takes writes"),
    ("disk.trusted", "disk_trusted", "1 while the disk cache dir passes the ownership checks"),
)


class CompilerCollector:
    """A prometheus_client collector of one Compiler: ``aionvrtc_*_total`` counters, gauges of
    the queue and memory, and ``aionvrtc_hit_ratio`` (hits over requests).

    ``register`` makes one and registers it; one made directly is registered with
    ``registry.register(collector)``.

    Args:
        compiler: The Compiler whose ``stats()`` each scrape reads.
        name: The value of the ``compiler`` label, to tell several compilers in one process
            apart.

    Raises:
        Nothing: nothing is checked or read until a scrape (``collect``).
    """

    def __init__(self, compiler: Compiler, *, name: str = "default") -> None:
        self.compiler = compiler
        self.name = name

    def describe(self) -> list[Any]:
        """The metrics described ahead of a scrape: none, as they are made at collect time.

        Returns:
            An empty list, so a registry checks no metric names when this is registered.
        """
        return []  # no fixed description: metrics are made at collect time

    def collect(self) -> Iterator[Any]:
        """The metrics, from one ``compiler.stats()``, as a registry's scrape asks for them.

        Yields:
            prometheus_client metric families: the counters and gauges, each labelled
            ``compiler``; ``aionvrtc_arch_compiles`` and ``aionvrtc_arch_memory_entries``,
            labelled ``compiler`` and ``arch``; then ``aionvrtc_hit_ratio``.

        Raises:
            ImportError: prometheus_client is not installed.
        """
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        stats: CompilerStats = self.compiler.stats()
        labels = ["compiler"]
        for field, name, text in _COUNTERS:
            counter = CounterMetricFamily(f"aionvrtc_{name}", text, labels=labels)
            counter.add_metric([self.name], float(attrgetter(field)(stats)))
            yield counter
        for field, name, text in _GAUGES:
            gauge = GaugeMetricFamily(f"aionvrtc_{name}", text, labels=labels)
            gauge.add_metric([self.name], float(attrgetter(field)(stats)))
            yield gauge
        # Each target's share (a Compiler serves every GPU of the host, one arch each).
        by_arch = ["compiler", "arch"]
        compiles = CounterMetricFamily(
            "aionvrtc_arch_compiles", "successful NVRTC compiles, by target arch", labels=by_arch
        )
        entries = GaugeMetricFamily(
            "aionvrtc_arch_memory_entries", "entries in the in-memory map, by arch", labels=by_arch
        )
        for arch, share in stats.archs.items():
            compiles.add_metric([self.name, arch], float(share.compiles))
            entries.add_metric([self.name, arch], float(share.entries))
        yield compiles
        yield entries
        hits = stats.memory.hits + stats.disk.hits + stats.remote.hits
        ratio = GaugeMetricFamily(
            "aionvrtc_hit_ratio", "cache hits (memory, disk, remote) over requests", labels=labels
        )
        ratio.add_metric([self.name], hits / stats.requests if stats.requests else 0.0)
        yield ratio


def register(
    compiler: Compiler, *, registry: CollectorRegistry | None = None, name: str = "default"
) -> CompilerCollector:
    """Register a CompilerCollector for ``compiler`` with ``registry`` and return it
    (``registry.unregister(it)`` removes it).

    Two collectors with one ``name`` in one registry are not refused (a scrape would then
    hold each series twice): give each Compiler a name of its own.

    Args:
        compiler: The Compiler whose ``stats()`` each scrape reads.
        registry: The registry to register with; default: the global prometheus_client
            registry (``prometheus_client.REGISTRY``).
        name: The value of the ``compiler`` label, to tell several compilers in one process
            apart.

    Returns:
        The registered ``CompilerCollector``.

    Raises:
        ImportError: prometheus_client is not installed (``pip install 'aionvrtc[metrics]'``).
    """
    try:
        from prometheus_client import REGISTRY
    except ImportError as exc:
        raise ImportError(
            "aionvrtc.metrics needs prometheus_client: pip install 'aionvrtc[metrics]'"
        ) from exc
    collector = CompilerCollector(compiler, name=name)
    (registry or REGISTRY).register(collector)
    return collector
