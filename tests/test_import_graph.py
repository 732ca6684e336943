"""The import graph of tuiprof's modules: no circles, and no import that points up the layers.

Every import counts, at module level or inside a function (a function-local import hides a
circle from Python, not from the reader), resolved statically from the sources. The layers are
the guide's one-way data flow in import terms (docs/extending.md, "Layers"): a module imports
its own layer and the layers below it, never one above. Start-up: ``import tuiprof.cli`` loads
exactly the modules recorded here (a function-local import is for start-up time only, and this
is what it buys)."""
from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "tuiprof"

# Lowest first. A module belongs to the longest prefix listed (a package covers its submodules);
# a module or package of tuiprof/ in no row fails the test: give it its layer here.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    # what every layer may use: errors, the sanitiser, phase names, the public step marks and
    # the start-up progress they report, the package face that re-exports the marks, and the
    # lazy package face (_lazy) the engine, export, sweep and sessions packages are built with,
    # and what a process does with its terminal once it is gone
    ("foundation", ("tuiprof", "tuiprof.errors", "tuiprof.text", "tuiprof.phases",
                    "tuiprof.marks", "tuiprof.startup", "tuiprof._lazy",
                    "tuiprof.terminal")),
    # the generation engine (models, families, the decode loop) and the native injection
    # library's build: they know nothing of a session
    ("engine", ("tuiprof.engine", "tuiprof.injection")),
    # the session store (the single source of truth) and control, the interface over it that
    # the UI drives; producers and consumers alike import it
    ("store", ("tuiprof.store", "tuiprof.control")),
    # producers on their own threads, writing into the store
    ("collect", ("tuiprof.collect",)),
    # pure functions over the store's views
    ("analysis", ("tuiprof.analysis",)),
    # the store's views written in other tools' formats, and the feeds
    ("export", ("tuiprof.export",)),
    # sessions: the profiler that wires one together, a user's program with its step sources
    # and its session, the session processes and their protocol
    ("session", ("tuiprof.profiler", "tuiprof.spec", "tuiprof.sampling", "tuiprof.program",
                 "tuiprof.sessions")),
    # studies that run many sessions
    ("sweep", ("tuiprof.sweep",)),
    # the Textual app and its screens (one of them runs a sweep)
    ("ui", ("tuiprof.ui",)),
    # argument parsing and printing: every command
    ("cli", ("tuiprof.cli", "tuiprof.__main__")),
)

# Known violations while the house is rebuilt. Each entry must go (the list shrinks to empty):
# an entry that no longer happens fails the test too, so it is removed when its import is.
# Circles are allowed only inside the listed packages; upward imports only as the listed pairs
# (importing package -> imported package).
KNOWN_CIRCLES: frozenset[str] = frozenset()
KNOWN_UPWARD: frozenset[tuple[str, str]] = frozenset()

# What `import tuiprof.cli` loads, the whole start-up of every command before its own run():
# tuiprof's modules, and none of the heavy third-party packages (each costs 0.1-3 s).
STARTUP_MODULES = (
    "tuiprof", "tuiprof.cli", "tuiprof.cli.common", "tuiprof.errors", "tuiprof.marks",
    "tuiprof.phases", "tuiprof.terminal", "tuiprof.text",
)
HEAVY = ("torch", "numpy", "textual", "rich", "transformers", "safetensors", "cupti", "pynvml",
         "jsonschema", "cxxfilt", "textual_plotext", "plotext", "prometheus_client",
         "opentelemetry", "fastapi", "uvicorn", "openai", "pydantic", "accelerate", "vllm")


def modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = ("tuiprof", *path.relative_to(PACKAGE).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _targets(mods: dict, name: str, is_package: bool, node) -> set[str]:
    """The tuiprof modules one import statement needs (``from . import mod`` needs ``mod``, not
    the package face; a name imported from a module needs that module)."""
    if isinstance(node, ast.ImportFrom):
        if node.level:
            base = name.split(".") if is_package else name.split(".")[:-1]
            base = base[: len(base) - node.level + 1]
            full = ".".join(base + ([node.module] if node.module else []))
        else:
            full = node.module or ""
        subs = [f"{full}.{a.name}" for a in node.names]
        wanted = [m for m in subs if m in mods] or [full]
    else:
        wanted = [a.name for a in node.names]
    found = set()
    for w in wanted:
        while w and w not in mods:
            w = w.rpartition(".")[0]
        if w.startswith("tuiprof"):
            found.add(w)
    return found


def import_graph() -> dict[str, set[str]]:
    mods = modules()
    graph = {m: set() for m in mods}
    for name, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                graph[name] |= _targets(mods, name, path.name == "__init__.py", node) - {name}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]; counter[0] += 1
        stack.append(root); on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter[0]; counter[0] += 1
                    stack.append(w); on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop(); on.discard(w); comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return sorted(out)


def unit(module: str) -> str:
    """The row of LAYERS a module falls in: its longest listed prefix."""
    best = ""
    for _, names in LAYERS:
        for n in names:
            if (module == n or module.startswith(n + ".")) and len(n) > len(best):
                best = n
    return best


def level(module: str) -> int:
    u = unit(module)
    return next(i for i, (_, names) in enumerate(LAYERS) if u in names)


def test_every_module_has_a_layer():
    # the package face "tuiprof" is a row of its own; a new top-level module or package must
    # say where it sits
    missing = sorted(m for m in modules() if m != "tuiprof" and unit(m) == "tuiprof")
    assert not missing, f"give these a layer in LAYERS ({__file__}): {missing}"


def test_no_import_circles():
    found = circles(import_graph())
    bad = [c for c in found if not any(all(m.startswith(p + ".") for m in c)
                                       for p in KNOWN_CIRCLES)]
    assert not bad, "import circles (break them; never with a function-local import): " + \
        "; ".join(" <-> ".join(c) for c in bad)
    stale = sorted(p for p in KNOWN_CIRCLES
                   if not any(all(m.startswith(p + ".") for m in c) for c in found))
    assert not stale, f"no circle left in {stale}: remove it from KNOWN_CIRCLES"


def test_no_upward_imports():
    graph = import_graph()
    up = {}
    for a, targets in graph.items():
        for b in targets:
            if level(b) > level(a):
                up.setdefault((unit(a), unit(b)), []).append(f"{a} -> {b}")
    bad = {k: v for k, v in up.items() if k not in KNOWN_UPWARD}
    assert not bad, "imports pointing up the layers (docs/extending.md, \"Layers\"): " + \
        "; ".join(sorted(x for v in bad.values() for x in v))
    stale = sorted(KNOWN_UPWARD - set(up))
    assert not stale, f"these no longer import upward: remove {stale} from KNOWN_UPWARD"


def test_the_cli_start_up_imports_stay_as_they_are():
    code = ("import json, sys; before = set(sys.modules); import tuiprof.cli; "
            "print(json.dumps(sorted(set(sys.modules) - before)))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       cwd=str(PACKAGE.parent))
    assert p.returncode == 0, p.stderr[-2000:]
    loaded = json.loads(p.stdout)
    ours = tuple(sorted(m for m in loaded if m.split(".")[0] == "tuiprof"))
    heavy = sorted({m.split(".")[0] for m in loaded} & set(HEAVY))
    assert not heavy, f"import tuiprof.cli loads {heavy}: import them inside the command's run()"
    assert ours == STARTUP_MODULES, (
        f"import tuiprof.cli now loads {ours}; if that is meant, record it in STARTUP_MODULES")
