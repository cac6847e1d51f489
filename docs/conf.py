"""Sphinx's configuration of the documentation site: Markdown pages (MyST), the API
reference from the code's docstrings (autodoc, Google style), and the pages generated
from the code and the committed results (``_ext/aionvrtc_docs.py``). Build it with::

    sphinx-build -W --keep-going -n -b html docs build/docs

Strict: a warning (a broken link, a reference that resolves nowhere, a public name
without a page) fails the build. Its code is formatted to 88 characters, as the pages'
code blocks are (``ruff.toml`` here).
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "_ext"))

import public_api  # noqa: E402

import aionvrtc  # noqa: E402

project = "aionvrtc"
author = "aionvrtc developers"
copyright = "aionvrtc developers"
release = version = aionvrtc.__version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "aionvrtc_docs",
]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "_ext", "_generated"]
templates_path: list[str] = []

# Markdown: headings get anchors ("#keys-and-host-files") to link to; ``{include}``
# pulls the generated tables in; a local file that is not a page is a download.
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence", "deflist"]
# Quotes and ellipses made typographic, but not dashes: a page's "--no-batch" is a flag
# to type, not an en dash.
smartquotes_action = "qe"

# The API reference: Google-style sections, types from the annotations.
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_typehints_format = "short"
# Types only for what a docstring documents (every parameter: tests/test_docstrings.py),
# so that a dataclass's fields, documented as its attributes, are not listed again as
# its parameters.
autodoc_typehints_description_target = "documented_params"
autodoc_default_options = {"members": True}
# tropical.torch imports CuPy and PyTorch: documented without them, as a documentation
# host (the ``docs`` extra alone, no GPU) builds the site; one that is installed is
# documented for real.
autodoc_mock_imports = public_api.missing_imports()
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False
napoleon_attr_annotations = True
# A dataclass's fields as a list, not entries beside autodoc's.
napoleon_use_ivar = True

# Every reference to aionvrtc must resolve (to its public name: see aionvrtc_docs);
# other packages' types are shown as written, without links (the build reads nothing off
# the network).
nitpicky = True
nitpick_ignore_regex = [(r"py:.*", r"(?!aionvrtc(\.|$)).*")]

html_theme = "furo"
html_title = f"aionvrtc {release}"
html_static_path = ["_static"]
html_favicon = "_static/favicon.svg"
html_show_sourcelink = False
