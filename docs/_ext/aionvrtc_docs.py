"""The site's own Sphinx extension: what is generated, not copied, and what makes the build
strict about the API.

- Generated before the pages are read, into ``docs/_generated/`` (git-ignored): the settings
  table from ``_config.SETTINGS``, the command-line reference from the argparse parsers, the
  performance pages from the committed results (``performance.py``: a table of headline
  figures, and each current benchmark's table, facts and a plot drawn from its JSON, a page per
  group of them); and ``docs/results/``, the committed results themselves, so that a page links
  a figure's file and the site serves it.
- A reference to a private path (``aionvrtc._spec.KernelSpec``, as annotations name it) is
  resolved to the public name the object is documented under (``aionvrtc.KernelSpec``).
- A public name (``public_api.names()``) that no page documents fails the build.
"""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path
from typing import Any

import public_api
from docutils import nodes
from sphinx.application import Sphinx
from sphinx.environment import BuildEnvironment
from sphinx.util import logging

logger = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
# The characters of a line a code block shows whole in the theme's column (furo's: 90 of its
# monospace at every desktop width, measured in Chromium): the pages' code blocks keep within
# it (tests/test_pages.py), and the command line's usage is wrapped to it.
CODE_WIDTH = 88


def _write(path: Path, text: str | bytes) -> None:
    """Write ``path`` only if its content changes, so that Sphinx reads again only what did."""
    data = text.encode() if isinstance(text, str) else text
    if path.exists() and path.read_bytes() == data:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def settings_table() -> str:
    """The environment variables aionvrtc reads, from ``_config.SETTINGS`` (its one list)."""
    from aionvrtc import _config

    rows = ["| variable | takes | without it |", "| --- | --- | --- |"]
    for name, (takes, default) in _config.SETTINGS.items():
        rows.append(f"| `{name}` | {takes} | {default} |")
    return "\n".join(rows) + "\n"


def _commands(parser: argparse.ArgumentParser) -> list[tuple[str, argparse.ArgumentParser]]:
    """Every command of ``parser``, depth first: (its words after ``aionvrtc``, its parser)."""
    found = []
    for action in parser._actions:  # argparse keeps its subcommands only here
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found.append((name, sub))
                found.extend((f"{name} {words}", leaf) for words, leaf in _commands(sub))
    return found


def _escape(text: str) -> str:
    return text.replace("|", "\\|")


def cli_reference() -> str:
    """The command line's reference, read from its argparse parsers: every command's usage,
    what it does, and each argument with its help."""
    from aionvrtc._cli import build_parser

    # argparse wraps usage to the terminal's width: the page's is its code blocks'.
    columns = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(CODE_WIDTH)
    try:
        return _cli_reference(build_parser())
    finally:
        if columns is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = columns


def _cli_reference(top: argparse.ArgumentParser) -> str:
    out = ["```text", top.format_usage().strip(), "```", ""]
    for words, command in _commands(top):
        if not command._actions or not any(a.help for a in command._actions):
            continue
        out += [f"### `aionvrtc {words}`", "", _escape(command.description or ""), ""]
        out += ["```text", command.format_usage().strip(), "```", ""]
        arguments = [
            a for a in command._actions
            if a.help not in (None, argparse.SUPPRESS)
            and not isinstance(a, (argparse._SubParsersAction, argparse._HelpAction))
        ]  # fmt: skip
        if arguments:
            out += ["| argument | what it does |", "| --- | --- |"]
            for action in arguments:
                metavar = action.metavar or (action.dest.upper() if action.option_strings
                                             else action.dest)  # fmt: skip
                shown = metavar if isinstance(metavar, str) else " ".join(metavar)
                names = ", ".join(action.option_strings) or shown
                if action.option_strings and action.nargs != 0:
                    names += f" {shown}" + (" ..." if action.nargs in ("+", "*") else "")
                out.append(f"| `{names}` | {_escape(action.help or '')} |")
            out.append("")
    return "\n".join(out)


def copy_results(target: Path) -> None:
    """The committed results, served by the site beside the pages that quote them: each
    markdown file a page (outside the table of contents), the rest downloads."""
    for path in sorted(RESULTS.rglob("*")):
        if not path.is_file():
            continue
        relative = path.relative_to(RESULTS)
        if path.suffix == ".md":
            # A link to a folder is GitHub's listing, which a site has no page for: plain text.
            text = re.sub(r"\[([^\]]+)\]\([^)]*/\)", r"\1", path.read_text("utf-8"))
            _write(target / relative, "---\norphan: true\n---\n\n" + text)
        else:
            _write(target / relative, path.read_bytes())


def generate(app: Sphinx) -> None:
    import performance

    docs = Path(app.srcdir)
    generated = docs / "_generated"
    _write(generated / "settings.md", settings_table())
    _write(generated / "cli.md", cli_reference())
    copy_results(docs / "results")
    pages, plots = performance.pages(RESULTS)
    for name, text in pages.items():
        _write(generated / "performance" / f"{name}.md", text)
    for group in performance.GROUPS:
        if not (docs / "performance" / f"{group.page}.md").is_file():
            raise ValueError(
                f"the performance group {group.page} has no page: write "
                f"docs/performance/{group.page}.md, which includes "
                f"../_generated/performance/{group.page}.md"
            )
    for name, png in plots.items():
        _write(docs / "results" / "plots" / name, png)
    stale = docs / "results" / "plots"
    for old in stale.glob("*.png"):
        if old.name not in plots:
            old.unlink()


def _public_by_object() -> dict[int, str]:
    """Each public object's id to the name it is documented under (the first, for an object
    exported twice)."""
    found: dict[int, str] = {}
    for name, obj in public_api.names().items():
        found.setdefault(id(obj), name)
    return found


def public_reference(
    app: Sphinx, env: BuildEnvironment, node: Any, contnode: nodes.Element
) -> nodes.Element | None:
    """Resolve ``aionvrtc._private.Name`` (how an annotation names a public class) to the
    public name the class is documented under; other missing references stay missing."""
    target = node.get("reftarget", "")
    if node.get("refdomain") != "py" or not target.startswith("aionvrtc.") or "._" not in target:
        return None
    import importlib

    module_name, _, attribute = target.rpartition(".")
    try:
        obj = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError):
        return None
    public = _public_by_object().get(id(obj))
    if public is None:
        # A type of aionvrtc's own that users meet only through a public one (a plan's steps,
        # a lock's hold): named as written, without a link, rather than a reference that fails.
        return contnode

    domain = env.get_domain("py")
    return domain.resolve_xref(
        env, node["refdoc"], app.builder, node["reftype"], public, node, contnode
    )


# How autodoc stands for a member that has no value of its own (Sphinx 9's sentinels, named by
# their repr: they moved between modules across releases).
_FIELD_SENTINELS = {"SLOTS_ATTR", "INSTANCE_ATTR"}


def skip_fields(  # noqa: PLR0917 (Sphinx's signature for the event)
    app: Sphinx, what: str, name: str, obj: Any, skip: bool, options: Any
) -> bool:
    """Leave a class's fields (a dataclass's, slots, annotated attributes) to its docstring's
    ``Attributes:``, one entry each: autodoc would add a second, empty one, and a field named
    ``bytes`` would then take the links of the builtin type."""
    if what == "class" and repr(obj) in _FIELD_SENTINELS:
        return True
    return skip


def check_coverage(app: Sphinx, env: BuildEnvironment) -> None:
    """Fail the build (a warning, under -W) for each public name no page documents."""
    documented = {name for name, *_ in env.get_domain("py").get_objects()}
    for name in sorted(public_api.names()):
        if name not in documented:
            logger.warning("the public name %s has no entry in the API reference", name)


def setup(app: Sphinx) -> dict[str, Any]:
    app.connect("builder-inited", generate)
    app.connect("missing-reference", public_reference)
    app.connect("env-check-consistency", check_coverage)
    app.connect("autodoc-skip-member", skip_fields)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
