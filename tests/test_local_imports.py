"""The import rules of packaged host code that imports project modules (runtime/local_imports.py): the project's
names reach the package's shipped copies (``<package>._ops._local.*``), by ``import``, ``from ... import`` and
``importlib.import_module`` alike, and nothing lands in ``sys.modules`` under the project's own names."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from forge_aot.runtime.local_imports import local_builtins


@pytest.fixture
def shipped(tmp_path: Path):
    """A package ``forge_li`` shipping the project package ``proj`` (proj/__init__.py, proj/sub.py)."""
    local = tmp_path / "forge_li" / "_ops" / "_local" / "proj"
    local.mkdir(parents=True)
    for init in (tmp_path / "forge_li", tmp_path / "forge_li" / "_ops", tmp_path / "forge_li" / "_ops" / "_local"):
        (init / "__init__.py").write_text("")
    (local / "__init__.py").write_text("")
    (local / "sub.py").write_text("VALUE = 7\n")
    sys.path.insert(0, str(tmp_path))
    yield local_builtins("forge_li", {"proj"})
    sys.path.remove(str(tmp_path))
    for name in [n for n in sys.modules if n == "forge_li" or n.startswith("forge_li.")]:
        del sys.modules[name]


@pytest.mark.parametrize("code", [
    "import importlib\nmod = importlib.import_module('proj.sub')",
    "import importlib.util\nmod = importlib.import_module('proj.sub')",  # binds importlib too, as Python does
    "from importlib import import_module\nmod = import_module('proj.sub')",
    "import importlib\nmod = importlib.import_module('.sub', 'proj')",  # relative to a project package
    "from proj import sub as mod",
])
def test_every_way_of_importing_a_project_module_reaches_the_shipped_copy(shipped, code: str) -> None:
    namespace: dict = {"__builtins__": shipped}
    exec(compile(code, "<host>", "exec"), namespace)
    assert namespace["mod"].__name__ == "forge_li._ops._local.proj.sub" and namespace["mod"].VALUE == 7
    assert "proj" not in sys.modules and "proj.sub" not in sys.modules


def test_a_missing_project_module_is_named_as_the_project_names_it(shipped) -> None:
    """FLA's ``fla/__init__.py`` probes optional parts with ``importlib.import_module('fla.layers')`` and treats a
    ModuleNotFoundError naming exactly that module as "not installed"."""
    namespace: dict = {"__builtins__": shipped}
    with pytest.raises(ModuleNotFoundError) as info:
        exec("import importlib\nimportlib.import_module('proj.layers')", namespace)
    assert info.value.name == "proj.layers" and str(info.value) == "No module named 'proj.layers'"
    namespace = {"__builtins__": shipped}
    exec("import importlib.util\nspec = importlib.util.find_spec('json')", namespace)  # the rest is importlib's
    assert namespace["spec"].name == "json"
