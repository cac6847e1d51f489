"""The command line, ``aionvrtc`` or ``python -m aionvrtc``: inspect, prune, warm and diagnose
the disk cache. Every command takes ``--json`` (one JSON document on stdout, for scripts) and
``--cache-dir`` (default: ``$AIONVRTC_CACHE_DIR``, else the user cache dir); tables and progress
for people are drawn by rich.

A failure is one line on stderr saying what was wrong and the fix (with ``--json``, also a JSON
document with an ``error`` field on stdout), exit status 1; bad usage exits 2 (argparse's), an
interrupt 130. Tracebacks only with ``--debug``.
"""

from ._main import DTYPE_NAMES, SEMIRING_NAMES, build_parser, main

__all__ = ["DTYPE_NAMES", "SEMIRING_NAMES", "build_parser", "main"]
