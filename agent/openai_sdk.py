"""The ``openai`` SDK as botd loads it: without the type modules it never touches.

``openai`` imports every model of its whole API from two package ``__init__``s,
``openai.types`` and ``openai.types.responses``: ~370 modules, ~9 MiB resident for the
daemon's whole life. botd sends its own request bytes and decodes the stream itself
(``agent.llm``), so it needs none of them. Both files are plain lists of re-exports, so
they are installed here as lazy packages: a name is imported from its submodule when it
is first read, and anything that reads one (the SDK itself, a test, a plugin) gets the
same object as before. An ``__init__`` with anything but relative imports in it is
loaded the usual way.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

LAZY_PACKAGES = ("openai.types", "openai.types.responses")  # parents first

Exports = dict[str, tuple[str | None, str]]  # name -> (relative submodule or None, attribute)


def exports_of(source: str) -> Exports | None:
    """What a package ``__init__`` re-exports, or None unless it does nothing else.

    Allowed: a docstring, ``from __future__ import ...``, ``from .sub import a as b`` and
    ``from . import sub``. Anything else (code, ``import *``, absolute imports) could have
    side effects a lazy package would skip.
    """
    names: Exports = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue
        if isinstance(node, ast.ImportFrom) and node.module == "__future__":
            continue
        if not (isinstance(node, ast.ImportFrom) and node.level == 1):
            return None
        for alias in node.names:
            if alias.name == "*":
                return None
            names[alias.asname or alias.name] = (node.module, alias.name)
    return names


def lazy_package(name: str, directory: Path, names: Exports) -> ModuleType:
    """A package module for ``directory`` whose ``names`` are imported on first read."""
    init = directory / "__init__.py"
    spec = importlib.util.spec_from_file_location(name, init, submodule_search_locations=[str(directory)])
    if spec is None:
        raise ImportError(f"no module spec for {init}")
    module = importlib.util.module_from_spec(spec)

    def __getattr__(attribute: str) -> object:  # PEP 562
        if attribute.startswith("__"):
            raise AttributeError(f"module {name!r} has no attribute {attribute!r}")
        submodule, original = names.get(attribute, (None, attribute))
        try:
            if submodule is None:  # ``from . import sub``, or a submodule nobody imported yet
                value: object = importlib.import_module(f"{name}.{original}")
            else:
                value = getattr(importlib.import_module(f"{name}.{submodule}"), original)
        except ModuleNotFoundError as exc:
            if exc.name != f"{name}.{original}":
                raise
            raise AttributeError(f"module {name!r} has no attribute {attribute!r}") from None
        setattr(module, attribute, value)
        return value

    def __dir__() -> list[str]:
        return sorted(set(module.__dict__) | set(names))

    # ``__all__``: ``import *`` still brings every name, eagerly
    module.__dict__.update(__getattr__=__getattr__, __dir__=__dir__, __all__=list(names))
    return module


def install(packages: tuple[str, ...]) -> None:
    """Put each of ``packages`` (of one top-level package, parents first) in ``sys.modules``
    as a lazy package, where it may be one."""
    top = packages[0].split(".")[0]
    if top in sys.modules:
        return  # already imported the usual way: nothing to save
    spec = importlib.util.find_spec(top)  # finds, does not import
    if spec is None or not spec.submodule_search_locations:
        return  # not installed: the import below says so
    root = Path(next(iter(spec.submodule_search_locations)))
    for name in packages:
        directory = root.joinpath(*name.split(".")[1:])
        try:
            names = exports_of((directory / "__init__.py").read_text(encoding="utf-8"))
        except (OSError, SyntaxError, UnicodeDecodeError):
            names = None
        if names is None:
            return  # this one and the ones inside it load the usual way
        module = lazy_package(name, directory, names)
        sys.modules[name] = module
        parent, _, child = name.rpartition(".")
        if parent in packages:
            setattr(sys.modules[parent], child, module)


install(LAZY_PACKAGES)

import openai  # noqa: E402  # after the install, which must come first

__all__ = ["openai"]
