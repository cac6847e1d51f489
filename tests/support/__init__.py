"""What the tests share, and what the benchmarks may use of them: the helpers live here, never in a
test module, so no test imports another. ``tests/conftest.py`` holds the fixtures only.

- ``specs``: tiny distinct kernels, slow ones, the folder of a cache dir's entries;
- ``processes``: a fresh interpreter, a forked child as another user;
- ``gpu``: the driver's errors as CuPy raises them, whether a GPU is here, a fake driver;
- ``redis``, ``cli``, ``layers``, ``examples``, ``disk``: a real redis-server, the command line in
  a process, a cache tree's contents, an example run, disk-tier entries and totals;
- ``tropical_data``, ``einsum``, ``seeds``: operands, networks, checks and printed seeds of the
  tropical tests;
- ``workloads``: the reliability workloads (also run by ``benchmarks/soak.py``).
"""

from .gpu import DRIVER_ERRORS, FakeDriver, driver_error, has_gpu
from .processes import NOBODY, ROOT, as_other_user, as_root, run_python
from .specs import ENTRIES, make_slow_spec, make_spec

__all__ = [
    "DRIVER_ERRORS",
    "ENTRIES",
    "NOBODY",
    "ROOT",
    "FakeDriver",
    "as_other_user",
    "as_root",
    "driver_error",
    "has_gpu",
    "make_slow_spec",
    "make_spec",
    "run_python",
]
