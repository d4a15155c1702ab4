"""The modules of the longctx package import each other without a cycle: imports flow one way (for the kernels:
public API -> dispatch -> autograd -> forms -> shared jit helpers). Every import counts, those inside functions
too: a lazy import hides a cycle from Python's start-up but not from a reader. Rooms keep to their doors: outside
longctx.kernels only its public packages are imported, the trainer reaches attention cores through the registry, and
scripts/ and tools/ share helpers through the package, never by importing each other, and tools reach the package
by its public names only (kernels through kernel_index)."""
import ast
import subprocess
import sys
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


# ----- rooms: the kernels are reached through their public face, the attention cores by the trainer too ----------

PUBLIC = {f"{PACKAGE}.kernels", f"{PACKAGE}.kernels.power", f"{PACKAGE}.models", f"{PACKAGE}.models.attention"}


def reaches_inside(importer: str, target: str) -> bool:
    """True when `importer` imports `target` below a public face: a kernel's module (dispatch, config, ...) from
    outside longctx.kernels, or, from longctx.train, an attention core's module (power, linear, ...) rather than the
    package that registers them."""
    kernels, cores = f"{PACKAGE}.kernels", f"{PACKAGE}.models.attention"
    if target in PUBLIC:
        return False
    if target.startswith(kernels + ".") and not (importer == kernels or importer.startswith(kernels + ".")):
        return True
    return importer.startswith(f"{PACKAGE}.train") and target.startswith(cores + ".")


def test_reaches_inside_rule():
    assert reaches_inside(f"{PACKAGE}.train.flops", f"{PACKAGE}.kernels.power.dispatch")
    assert reaches_inside(f"{PACKAGE}.train.flops", f"{PACKAGE}.models.attention.power")
    assert reaches_inside(f"{PACKAGE}.models.attention.power", f"{PACKAGE}.kernels.power.interface")
    assert not reaches_inside(f"{PACKAGE}.train.flops", f"{PACKAGE}.kernels.power")
    assert not reaches_inside(f"{PACKAGE}.train.config", f"{PACKAGE}.models.attention")
    assert not reaches_inside(f"{PACKAGE}.kernels.power.dispatch", f"{PACKAGE}.kernels.power.autograd")
    assert not reaches_inside(f"{PACKAGE}.models.gpt2", f"{PACKAGE}.models.attention.shared")


def test_no_module_reaches_below_a_public_face():
    mods = modules()
    bad = sorted(f"{name} -> {target}" for name, path in mods.items()
                 for target in imported(name, path, set(mods)) if reaches_inside(name, target))
    assert not bad, "imports below a public interface: " + ", ".join(bad)


# ----- scripts/ and tools/ share helpers through the package, never through each other ---------------------------

REPO = SRC.parent


def top_level_imports(path: Path) -> set[str]:
    """First components of every absolute import in a file, those inside functions too."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            out.add(node.module.split(".")[0])
    return out


def cross_imports(folder: str, other: str, root: Path = REPO) -> list[str]:
    """`folder`'s files that import `other` as a package (`from tools import x`) or one of its modules by bare name
    (`import bench_attention` after a sys.path edit)."""
    names = {other} | {p.stem for p in (root / other).glob("*.py")}
    return sorted(f"{p.relative_to(root)} imports {sorted(top_level_imports(p) & names)}"
                  for p in (root / folder).rglob("*.py") if top_level_imports(p) & names)


def test_cross_imports_are_found(tmp_path):
    (tmp_path / "scripts").mkdir()
    (tmp_path / "tools").mkdir()
    (tmp_path / "tools" / "helper.py").write_text("X = 1\n")
    (tmp_path / "scripts" / "bench.py").write_text("def f():\n    from tools.helper import X\n")
    (tmp_path / "scripts" / "plot.py").write_text("import helper\nimport json\n")
    (tmp_path / "scripts" / "clean.py").write_text("from longctx.kernels import bench\n")
    assert cross_imports("scripts", "tools", tmp_path) == ["scripts/bench.py imports ['tools']",
                                                           "scripts/plot.py imports ['helper']"]


def test_scripts_and_tools_do_not_import_each_other():
    assert cross_imports("scripts", "tools") == []
    assert cross_imports("tools", "scripts") == []


def test_the_package_imports_neither_scripts_nor_tools():
    assert cross_imports("src", "scripts") == []
    assert cross_imports("src", "tools") == []


def _private_uses(path: Path) -> list:
    """'module.attr' for every private attribute a file reads of a longctx module it imported, and every private
    name it imports from longctx."""
    tree = ast.parse(path.read_text())
    aliases, found = set(), []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(PACKAGE):
            for a in node.names:
                if a.name.startswith("_"):
                    found.append(f"{node.module}.{a.name}")
                aliases.add(a.asname or a.name)
        elif isinstance(node, ast.Import):
            aliases.update(a.asname or a.name.split(".")[0] for a in node.names if a.name.startswith(PACKAGE))
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
                and isinstance(node.value, ast.Name) and node.value.id in aliases):
            found.append(f"{node.value.id}.{node.attr}")
    return found


def test_no_tool_reaches_a_private_name_of_the_package():
    """Tools name kernels through longctx.kernels.power.kernel_index, never by a module's private attribute."""
    uses = {p.name: _private_uses(p) for p in sorted((REPO / "tools").glob("*.py"))}
    assert {name: u for name, u in uses.items() if u} == {}


def test_the_private_name_check_sees_both_forms(tmp_path):
    f = tmp_path / "t.py"
    f.write_text("from longctx.kernels.power import parallel as ta\nfrom longctx.kernels.power.gates import "
                 "_segment_cumsum\nta._attn_fwd[(1,)]()\nta.blocks(64)\n")
    assert _private_uses(f) == ["longctx.kernels.power.gates._segment_cumsum", "ta._attn_fwd"]


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        node = todo.pop()
        if node not in seen:
            seen.add(node)
            todo.extend(graph.get(node, ()))
    return seen


# Loading a trained run (and the CLIs built on it) needs the model and the checkpoint reader, not the trainer
TRAINER_FREE = ("runs", "evaluate", "generate")


def test_loading_a_run_imports_no_trainer_code():
    mods = modules()
    graph = {name: imported(name, path, set(mods)) for name, path in mods.items()}
    for name in TRAINER_FREE:
        assert f"{PACKAGE}.train.trainer" not in reachable(graph, f"{PACKAGE}.{name}"), name
    code = (f"import sys; import {', '.join(f'{PACKAGE}.{n}' for n in TRAINER_FREE)}; "
            f"print('{PACKAGE}.train.trainer' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == "False", proc.stderr[-2000:]
