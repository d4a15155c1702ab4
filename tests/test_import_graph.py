"""The modules of the longctx package import each other without a cycle: imports flow one way (for the kernels:
public API -> dispatch -> autograd -> forms -> shared jit helpers). Every import counts, those inside functions
too: a lazy import hides a cycle from Python's start-up but not from a reader."""
import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = "longctx"           # pyproject maps longctx -> src


def modules() -> dict[str, Path]:
    """Dotted module name -> file, for every .py under src/ (a package is its __init__)."""
    out = {}
    for path in SRC.rglob("*.py"):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join([PACKAGE, *parts])] = path
    return out


def imported(name: str, path: Path, known: set[str]) -> set[str]:
    """The package modules `name` imports anywhere in its file: relative imports resolved, `from X import y` counted
    as X.y where that is a module, else X."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [(alias.name, None) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            targets = [(base, alias.name) for alias in node.names]
        else:
            continue
        for base, attr in targets:
            if attr and f"{base}.{attr}" in known:
                out.add(f"{base}.{attr}")
            elif base in known:
                out.add(base)
    out.discard(name)
    return out


def find_cycle(graph: dict[str, set[str]]):
    """One cycle of the graph as a list of modules (first == last), or None."""
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_find_cycle_finds_one_and_only_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_relative_and_lazy_imports_are_resolved(tmp_path):
    path = tmp_path / "m.py"
    path.write_text("from . import b\nfrom .c import f\n\ndef g():\n    from ..top import x\n")
    known = {"pkg.sub.b", "pkg.sub.c", "pkg.top"}
    assert imported("pkg.sub.m", path, known) == {"pkg.sub.b", "pkg.sub.c", "pkg.top"}


def test_package_import_graph_has_no_cycle():
    mods = modules()
    assert f"{PACKAGE}.kernels.power.dispatch" in mods
    graph = {name: imported(name, path, set(mods)) for name, path in mods.items()}
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)
