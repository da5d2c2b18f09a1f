"""The package's import order: every import under ``ocria/``, those inside functions included, goes from a higher
floor to a strictly lower one, so no import cycle can hide behind a lazy import."""

import ast
import re
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).parent.parent / "ocria"
# Lowest first. A module may import only from floors below its own (and from inside its own package).
FLOORS = (
    ("errors",),
    ("deps", "device", "manifest", "staging"),
    ("plugins", "data"),
    ("models",),
    ("runtime",),
    ("quant",),
    ("builder",),
    ("serving", "train"),
    ("bench",),
    ("cli", "__main__"),
)
FLOOR = {name: i for i, names in enumerate(FLOORS) for name in names}


def _package(path: Path) -> str:
    """The top-level unit of ``ocria`` a file belongs to: its subpackage, or its module name."""
    parts = path.relative_to(PACKAGE).parts
    return parts[0] if len(parts) > 1 else parts[0].removesuffix(".py")


def _imported_units(tree: ast.AST, path: Path) -> set[str]:
    """Top-level ``ocria`` units named by every import statement of a module, at any depth, and by
    ``importlib.import_module("ocria...")`` calls."""
    units = set()
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against the file's package
                base = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)[: -node.level]
                names = [".".join(base + ([node.module] if node.module else []))]
            elif node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names if node.module == "ocria"]
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "import_module" and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            names = [node.args[0].value]
        for name in names:
            parts = name.split(".")
            if parts[0] == "ocria" and len(parts) > 1:
                units.add(parts[1])
    return units


def import_edges() -> dict[tuple[str, str], list[str]]:
    """(importer unit, imported unit) -> the files that make the edge."""
    edges: dict[tuple[str, str], list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        unit = _package(path)
        for target in _imported_units(ast.parse(path.read_text()), path) - {unit}:
            edges.setdefault((unit, target), []).append(str(path.relative_to(PACKAGE.parent)))
    return edges


def test_every_unit_has_a_floor():
    units = {_package(p) for p in PACKAGE.rglob("*.py")} - {"__init__"}
    assert units <= set(FLOOR), f"give these a floor in FLOORS: {sorted(units - set(FLOOR))}"


def test_imports_only_go_down():
    upward = {edge: files for edge, files in import_edges().items() if FLOOR[edge[0]] <= FLOOR[edge[1]]}
    assert not upward, "imports that go up or sideways (a cycle waiting to happen): " + "; ".join(
        f"{a} -> {b} in {', '.join(files)}" for (a, b), files in sorted(upward.items()))


def test_the_checker_sees_lazy_and_relative_imports(tmp_path):
    """The check is only as good as its parser: an import inside a function, a relative import and an
    ``import_module`` string all count."""
    code = ("def f():\n    from ocria.serving import x\n"
            "from ..runtime import engine\n"
            "import importlib\nimportlib.import_module('ocria.train.run')\n")
    path = PACKAGE / "quant" / "probe.py"  # never written: the parser only needs the path for relative imports
    assert _imported_units(ast.parse(code), path) == {"serving", "runtime", "train"}
    assert "runtime" in {b for (a, b) in import_edges() if a == "quant"}  # calibration runs the runtime


def test_importing_the_plugins_registers_every_operator():
    """``import ocria.plugins`` alone (a fresh interpreter) defines every ``torch.ops.ocria`` operator that any
    plugin declares, so tools that only load the ops (opcheck, torch.compile, a profiler) need nothing else."""
    declared = {m for path in (PACKAGE / "plugins").rglob("*.py")
                for m in re.findall(r'custom_op\("ocria::(\w+)"', path.read_text())}
    code = (f"import torch, ocria.plugins\nnames = {sorted(declared)!r}\n"
            "print(' '.join(n for n in names if hasattr(torch.ops.ocria, n)))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert len(declared) >= 20 and set(run.stdout.split()) == declared
