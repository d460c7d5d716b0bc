"""Sphinx configuration: the user guide (Markdown, MyST) and the API reference (autodoc + numpydoc).

Build: ``python -m sphinx -W --keep-going -b html docs <out>`` (``tests/test_docs.py`` runs it).
Offline by design: no intersphinx inventory is fetched, so the build needs no network.
"""

from __future__ import annotations

import importlib
import warnings

from sphinx.util import logging as sphinx_logging

import swpipe

project = "swpipe"
author = "swpipe developers"
copyright = "swpipe developers, BSD 3-Clause"  # noqa: A001 - Sphinx's name
release = version = swpipe.__version__

extensions = [
    "sphinx.ext.autodoc",
    "numpydoc",
    "myst_parser",
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build"]

# Markdown pages link to each other as ``[text](page.md)`` and to headings as ``[text](page.md#anchor)``.
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence"]

# The API reference documents the names of ``import swpipe`` under those names; their docstrings are
# numpydoc style. Members are listed by autodoc (``:members:``), so numpydoc adds no second table of them.
autodoc_member_order = "bysource"
autodoc_typehints = "none"  # the signatures show them; numpydoc's Parameters sections say what they mean
autodoc_default_options = {"members": True}
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
numpydoc_attributes_as_param_list = False
numpydoc_xref_param_type = False

# TorchRec is optional (``pip install -e ".[peer]"`` plus ``scripts/install_peer.sh``): without it,
# ``swpipe.torchrec`` is documented against stand-ins for its imports.
autodoc_mock_imports: list = []
for _name in ("fbgemm_gpu", "torchrec"):
    try:
        importlib.import_module(_name)
    except Exception:  # noqa: BLE001 - missing, or a build that does not load: document without it
        autodoc_mock_imports = ["fbgemm_gpu", "torchrec"]
        break

html_theme = "alabaster"
html_title = f"swpipe {release}"
html_static_path: list = []


# The docstrings name objects by the module that defines them (``swpipe_core.validate.validate``); the
# reference documents them under the public names (``swpipe.validate``): a reference to one of those
# objects, or to a member of one, links to its entry.
_PUBLIC_PACKAGES = ("swpipe", "swpipe.testing", "swpipe.torchrec")


def _public_objects():
    for package in _PUBLIC_PACKAGES:
        try:
            module = importlib.import_module(package)
        except ImportError:
            continue
        for name in getattr(module, "__all__", ()):
            public = getattr(module, name, None)
            if public is not None:
                yield f"{package}.{name}", public


def _locate(target: str):
    """The object a dotted name names: its longest importable module prefix, then attributes."""
    parts = target.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except Exception:  # noqa: BLE001 - not a module (or not importable here): a shorter prefix
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr, None)
            if obj is None:
                return None
        return obj
    return None


def _public_name(target: str):
    """The public name of ``target`` (``swpipe_core.plan.PipelinePlan.bind`` -> ``swpipe.PipelinePlan.bind``)."""
    obj = _locate(target)
    if obj is not None:
        for name, public in _public_objects():
            if public is obj:
                return name
    head, _, attr = target.rpartition(".")
    owner = _locate(head) if head else None
    if owner is not None and hasattr(owner, attr):
        for name, public in _public_objects():
            if public is owner:
                return f"{name}.{attr}"
    return None


def _link_to_public_name(app, env, node, contnode):
    if node.get("refdomain") != "py" or node.get("reftype") == "mod":
        return None
    target = node.get("reftarget", "")
    public = _public_name(target) if "." in target else None
    if public is None or public == target:
        return None
    return env.get_domain("py").resolve_xref(env, node["refdoc"], app.builder, node["reftype"], public, node,
                                             contnode)


# numpydoc reports a docstring it cannot parse (an unknown section, a wrong underline) as a Python
# UserWarning, which ``sphinx -W`` would not see: it becomes a Sphinx warning here, so the build fails on it.
_numpydoc_log = sphinx_logging.getLogger("numpydoc")
_show_warning = warnings.showwarning


def _numpydoc_warning(message, category, filename, lineno, file=None, line=None):
    if issubclass(category, UserWarning) and "numpydoc" in str(filename):
        _numpydoc_log.warning("numpydoc: %s", message)
    else:
        _show_warning(message, category, filename, lineno, file, line)


warnings.showwarning = _numpydoc_warning


def setup(app):
    app.connect("missing-reference", _link_to_public_name)
