"""The package's import graph: no cycle, and the library never imports a
tool (the partition is python/cadence/_layers.py). Reads every `import`
statement with `ast`, those inside functions too, so it needs neither the
compiled core nor any optional dependency."""

from __future__ import annotations

import ast
import importlib.util
import pathlib
import subprocess
import sys

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "python" / "cadence"
#: Extension modules: no source to read, they import nothing of the package.
EXTENSIONS = ("cadence._core",)


def _load_layers():
    # By path: the test must not need `import cadence` (the compiled core).
    spec = importlib.util.spec_from_file_location("_cadence_layers", PACKAGE / "_layers.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


layers = _load_layers()


def modules(root: pathlib.Path = PACKAGE) -> dict[str, tuple[pathlib.Path | None, bool]]:
    """Dotted name → (source file, is a package)."""
    out: dict[str, tuple[pathlib.Path | None, bool]] = {}
    for p in sorted(root.rglob("*.py")):
        parts = list(p.relative_to(root.parent).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        if is_pkg:
            parts.pop()
        out[".".join(parts)] = (p, is_pkg)
    for name in EXTENSIONS:
        out[name] = (None, False)
    return out


def _resolve(name: str, known) -> str | None:
    """The module `name` names: itself, or the nearest package above it
    (`cadence.topo.load` is an attribute of `cadence.topo`)."""
    while name:
        if name in known:
            return name
        name = name.rpartition(".")[0]
    return None


def imports_of(module: str, source: str, is_pkg: bool, known) -> set[str]:
    """The package's modules that `module` imports anywhere in `source`.
    `from P import x` imports the module P.x when there is one, else P.
    The implicit import of a module's parent packages does not count: a
    package's __init__ importing its own modules is how Python packages
    work, not a cycle."""
    here = module if is_pkg else module.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = here.split(".")[: len(here.split(".")) - (node.level - 1)]
                base = ".".join(up + ([node.module] if node.module else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base
                       for a in node.names]
        else:
            continue
        for t in targets:
            r = _resolve(t, known)
            if r is not None and r != module:
                out.add(r)
    return out


def graph(root: pathlib.Path = PACKAGE) -> dict[str, set[str]]:
    known = modules(root)
    return {m: (imports_of(m, p.read_text(), is_pkg, known) if p is not None else set())
            for m, (p, is_pkg) in known.items()}


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """One cycle through each strongly connected component with more than
    one module (Tarjan), as [a, b, ..., a]."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    comps: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(g.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return [_cycle_in(g, set(c)) for c in comps]


def _cycle_in(g: dict[str, set[str]], comp: set[str]) -> list[str]:
    # A shortest path back to the first module, inside the component.
    start = min(comp)
    prev: dict[str, str] = {}
    todo = [start]
    while todo:
        nxt = []
        for v in todo:
            for w in sorted(g[v] & comp):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(prev[path[-1]])
                    return [start] + path[::-1][1:] + [start] if v != start else [start, start]
                if w not in prev:
                    prev[w] = v
                    nxt.append(w)
        todo = nxt
    return sorted(comp)


def forbidden(g: dict[str, set[str]]) -> list[tuple[str, str]]:
    """(library module, tool module it imports)."""
    return sorted((m, t) for m, ts in g.items() for t in ts
                  if layers.layer(m) == "library" and layers.layer(t) == "tools")


# --- the package -------------------------------------------------------------


def test_every_module_is_in_a_layer():
    loose = [m for m in modules() if layers.layer(m) is None]
    assert not loose, f"modules in neither layer (add them to cadence/_layers.py): {loose}"


def test_the_import_graph_has_no_cycle():
    found = cycles(graph())
    assert not found, "import cycles:\n" + "\n".join(" -> ".join(c) for c in found)


def test_the_library_imports_no_tool():
    bad = forbidden(graph())
    assert not bad, "library modules importing tools:\n" + "\n".join(
        f"{m} imports {t}" for m, t in bad)


def test_import_cadence_loads_only_the_library():
    # What `import cadence` loads at run time, beyond what the source says:
    # no tool, and not the classifier (the watchdog loads it when it judges).
    try:
        import cadence
    except ImportError as e:
        pytest.skip(f"the compiled core is not built: {e}")
    code = ("import sys, cadence; "
            "print('\\n'.join(m for m in sys.modules if m.startswith('cadence')))")
    where = str(pathlib.Path(cadence.__file__).parent.parent)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=where).stdout.split()
    assert "cadence.diagnosis.live" in out
    tools = [m for m in out if layers.layer(m) != "library"]
    assert not tools, f"`import cadence` loads tool modules: {tools}"
    offline = {"cadence.diagnosis.classify", "cadence.diagnosis.slow"} & set(out)
    assert not offline, f"`import cadence` loads the classifier: {sorted(offline)}"


# --- the checks themselves can fail -------------------------------------------


def _package(tmp_path: pathlib.Path, files: dict[str, str]) -> pathlib.Path:
    root = tmp_path / "cadence"
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return root


def test_a_new_module_in_a_mixed_package_has_no_layer_until_placed():
    assert layers.layer("cadence.torch.new") == "library"
    assert layers.layer("cadence.cli.new") == "tools"
    assert layers.layer("cadence.new") is None
    assert layers.layer("cadence.diagnosis.new") is None
    assert layers.layer("cadence.diagnosis") == "library"


def test_a_cycle_through_a_function_local_import_is_found(tmp_path):
    root = _package(tmp_path, {
        "__init__.py": "",
        "diagnosis/__init__.py": "",
        "diagnosis/classify.py": "def f():\n    from cadence.diagnosis.slow import g\n",
        "diagnosis/slow.py": "from cadence.diagnosis import classify\n",
        "diagnosis/dumps.py": "from . import verdict\n",
        "diagnosis/verdict.py": "",
    })
    g = graph(root)
    assert g["cadence.diagnosis.dumps"] == {"cadence.diagnosis.verdict"}
    assert cycles(g) == [["cadence.diagnosis.classify", "cadence.diagnosis.slow",
                          "cadence.diagnosis.classify"]]


def test_a_library_module_importing_a_tool_is_found(tmp_path):
    root = _package(tmp_path, {
        "__init__.py": "import os\n",
        "cli/__init__.py": "",
        "cli/bench.py": "import cadence\n",
        "diagnosis/__init__.py": "",
        "diagnosis/live.py": "def f():\n    import cadence.cli.bench\n",
    })
    g = graph(root)
    assert forbidden(g) == [("cadence.diagnosis.live", "cadence.cli.bench")]
    assert cycles(g) == []  # tools may import the library


def test_a_package_importing_its_modules_is_no_cycle(tmp_path):
    root = _package(tmp_path, {
        "__init__.py": "from cadence import fused\n",
        "fused/__init__.py": "from cadence.fused.matmul import f\n",
        "fused/matmul.py": "from cadence import _core\n",
    })
    g = graph(root)
    assert g["cadence"] == {"cadence.fused"}
    assert g["cadence.fused.matmul"] == {"cadence._core"}
    assert cycles(g) == []
