"""The ``openai`` SDK loads without its type modules, and every name in them still resolves."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from agent.openai_sdk import exports_of

ROOT = Path(__file__).resolve().parents[2]


def run_python(script: str) -> str:
    """The last line a fresh interpreter prints for ``script``."""
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], cwd=ROOT, capture_output=True,
                         text=True, timeout=120, env={"PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.splitlines()[-1]


# What a name is, comparable across interpreters: a class or function by where it is
# defined, anything else (type aliases, constants) by its repr.
PUBLIC_NAMES = """
import __future__, importlib, json, sys, types
def identity(value):
    if hasattr(value, "__qualname__") and hasattr(value, "__module__"):
        return f"{value.__module__}:{value.__qualname__}"
    return repr(value)
found = {}
for package in ("openai.types", "openai.types.responses"):
    module = importlib.import_module(package)
    for name in dir(module):
        value = getattr(module, name)
        if not name.startswith("_") and not isinstance(value, (types.ModuleType, __future__._Feature)):
            found[f"{package}.{name}"] = identity(value)
print(json.dumps(found))
"""


def test_exports_of_reads_plain_reexports() -> None:
    source = '''"""Doc."""
from __future__ import annotations

from .batch import Batch as Batch
from .shared import (
    Metadata as Metadata,
    Reasoning,
)
from . import chat
'''
    assert exports_of(source) == {
        "Batch": ("batch", "Batch"),
        "Metadata": ("shared", "Metadata"),
        "Reasoning": ("shared", "Reasoning"),
        "chat": (None, "chat"),
    }


@pytest.mark.parametrize(
    "source",
    [
        "from .a import A\nA.model_rebuild()\n",  # code with side effects
        "from .a import *\n",
        "from os import path\n",
        "import os\n",
        "from .a import A\nif True:\n    from .b import B\n",
    ],
)
def test_anything_but_reexports_is_loaded_the_usual_way(source: str) -> None:
    assert exports_of(source) is None


def test_the_sdk_loads_without_its_type_modules() -> None:
    loaded = json.loads(run_python("""
        import json, sys
        import agent.llm, bot.cli, bot.daemon
        print(json.dumps(sorted(m for m in sys.modules if m.startswith("openai.types"))))
    """))
    assert "openai.types.responses.response" not in loaded
    assert "openai.types.batch" not in loaded
    assert len(loaded) < 150, len(loaded)  # ~470 when the package __init__s run


def test_every_type_name_resolves_as_it_does_without_the_lazy_packages() -> None:
    lazy = json.loads(run_python("import agent.openai_sdk\n" + PUBLIC_NAMES))
    usual = json.loads(run_python("import openai\n" + PUBLIC_NAMES))
    assert len(usual) > 300
    assert lazy == usual


def test_submodules_and_from_imports_work_through_a_lazy_package() -> None:
    out = run_python("""
        from agent.openai_sdk import openai
        from openai.types import Batch
        from openai.types.responses import ResponseUsage
        import openai.types.chat
        print(openai.types.chat.ChatCompletionChunk.__name__, Batch is openai.types.Batch,
              openai.types.responses.ResponseUsage is ResponseUsage, hasattr(openai.types, "nothing_such"))
    """)
    assert out == "ChatCompletionChunk True True False"


def install_own_package(tmp_path: Path, top_init: str, sub_init: str, then: str) -> str:
    """Write ``toppkg.sub`` (whose ``heavy`` module holds ``Thing``) under ``tmp_path``, make
    it lazy with ``install`` in a fresh interpreter, run ``then`` there; its last line."""
    package = tmp_path / "toppkg" / "sub"
    package.mkdir(parents=True)
    (tmp_path / "toppkg" / "__init__.py").write_text(top_init)
    (package / "__init__.py").write_text(sub_init)
    (package / "heavy.py").write_text("Thing = 'thing'\n")
    return run_python(f"""
import sys
sys.path.insert(0, {str(tmp_path)!r})
from agent.openai_sdk import install
install(("toppkg.sub",))
""" + textwrap.dedent(then))


def test_a_lazy_package_imports_a_submodule_only_when_a_name_is_read(tmp_path: Path) -> None:
    out = install_own_package(
        tmp_path, "from . import sub\n", "from .heavy import Thing as Thing\n",  # as openai binds its types
        """
        import toppkg.sub
        before = "toppkg.sub.heavy" in sys.modules
        print(before, toppkg.sub.Thing, "toppkg.sub.heavy" in sys.modules)
        """,
    )
    assert out == "False thing True"


def test_a_package_init_with_code_is_not_made_lazy(tmp_path: Path) -> None:
    out = install_own_package(
        tmp_path, "", "from .heavy import Thing as Thing\nLOADED = True\n",
        """
        installed = "toppkg.sub" in sys.modules
        import toppkg.sub
        print(installed, toppkg.sub.LOADED, "toppkg.sub.heavy" in sys.modules)
        """,
    )
    assert out == "False True True"
