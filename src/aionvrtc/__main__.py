"""``python -m aionvrtc``: the command line (see aionvrtc._cli)."""

import sys

from ._cli import main

sys.exit(main())
