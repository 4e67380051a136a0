"""The one-way layering of broker/: every import that runs goes from a higher layer to a
strictly lower one, and inside a package the modules import each other one way too (no
cycles). A new package gets a rank here, which is where its place in the design is decided.

An import that runs is any import statement, function-local ones included (a function-local
import only delays a cycle, it does not remove it). Imports under `if TYPE_CHECKING:` are left
out: they never run, so they order nothing at start-up; they name the types a seam passes.

The tools beside the broker stay beside it: the load generator (hare_perf) imports nothing of
the broker, and the broker nothing of the tools."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BROKER = ROOT / "broker"
TOOLS = ("hare_perf", "hare_bench")

# lower number = lower layer; a module may import only from layers below its own
RANK = {
    # the bottom: wire format, settings, logging
    "protocol": 0, "config": 0, "logs": 0, "amqp_uri": 0, "compiled": 0, "signals": 0,
    "message": 1, "access": 1,
    # routing, stores, flow control
    "routing": 2, "store": 2, "flow": 2,
    "queue": 3,
    "server": 4, "policy": 4,
    "cluster": 5, "mgmt": 5, "shovel": 5, "federation": 5,
    "vhost_params": 6,
    "vhost": 7,
    # on top: the node, its entry points, tools and connectors outside the broker
    "node": 8, "spark": 8,
    "cli": 9, "ctl": 9, "__main__": 10,
}


def _package(path: Path) -> str:
    rel = path.relative_to(BROKER).with_suffix("")
    return rel.parts[0]


def _imports(tree: ast.Module, *, typing_too: bool = False
             ) -> list[tuple[int, str, tuple[str, ...]]]:
    """(line, module, names taken from it) of each import of broker or the tools that runs,
    wherever it is (function-local ones too); with `typing_too`, those under TYPE_CHECKING
    as well."""
    typing_only: set[int] = set()
    for node in ast.walk(tree):
        if not typing_too and isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(
                node.test):
            typing_only.update(id(n) for n in ast.walk(node))
    out: list[tuple[int, str, tuple[str, ...]]] = []
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found = [(node.module, tuple(a.name for a in node.names))]
        elif isinstance(node, ast.Import):
            found = [(a.name, ()) for a in node.names]
        else:
            continue
        out += [(node.lineno, module, names) for module, names in found
                if module.split(".")[0] in ("broker", *TOOLS)]
    return out


def _runtime_imports(tree: ast.Module, *, typing_too: bool = False) -> list[tuple[int, str]]:
    return [(line, module) for line, module, _ in _imports(tree, typing_too=typing_too)]


def _modules() -> list[Path]:
    return sorted(p for p in BROKER.rglob("*.py") if p.name != "__init__.py" or p.parent != BROKER)


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(BROKER)))
def test_imports_go_down_the_layers(path: Path) -> None:
    source = _package(path)
    assert source in RANK, f"broker/{source} has no layer: give it a rank in {__file__}"
    upward = [
        f"line {line}: {name} (layer {RANK.get(name.split('.')[1])} >= {RANK[source]})"
        for line, name in _runtime_imports(ast.parse(path.read_text()))
        if name.startswith("broker.") and name.split(".")[1] != source
        and RANK.get(name.split(".")[1], 99) >= RANK[source]
    ]
    assert not upward, f"broker/{source} imports upward or sideways at run time: {upward}"


# Plugins (RabbitMQ's word): parts the node starts beside itself. Each is registered on the
# node by its registrar (broker/node/plugin.py: Node.add_plugin) and fed the node's events;
# nothing else names it, not even for a type.
PLUGINS = {"mgmt": ("cli",), "shovel": ("cli",), "federation": ("cli",)}


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(BROKER)))
def test_plugins_are_attached_not_reached(path: Path) -> None:
    source = _package(path)
    reached = [
        f"line {line}: {name}"
        for line, name in _runtime_imports(ast.parse(path.read_text()), typing_too=True)
        for plugin, registrars in PLUGINS.items()
        if name.split(".")[:2] == ["broker", plugin] and source not in (plugin, *registrars)
    ]
    assert not reached, f"broker/{source} reaches a plugin (use the node's events): {reached}"


def test_an_upward_import_is_caught() -> None:
    tree = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                     "    from broker.node import Node\nfrom broker.server.reader import X\n")
    assert _runtime_imports(tree) == [(4, "broker.server.reader")]


@pytest.mark.parametrize("path", [*sorted(BROKER.rglob("*.py")),
                                  *sorted((ROOT / "hare_perf").rglob("*.py"))],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_the_broker_and_the_load_generator_stand_apart(path: Path) -> None:
    """broker/ needs no tool to run; hare_perf measures any broker, so it needs no Hare."""
    other = ("hare_perf", "hare_bench") if path.is_relative_to(BROKER) else ("broker", "hare_bench")
    tree = ast.parse(path.read_text())
    found = [f"line {line}: {name}" for line, name in _runtime_imports(tree, typing_too=True)
             if name.split(".")[0] in other]
    assert not found, f"{path.relative_to(ROOT)} imports {other}: {found}"


# -- no cycles inside a package ---------------------------------------------------------------
# Across packages the ranks above already forbid a cycle (an import goes strictly down). Inside
# one package, modules share a rank, so the order is held here: the modules of a package import
# each other one way, like the layers. Function-local imports count (they are how a cycle hides:
# the import merely runs later); imports under TYPE_CHECKING do not, as above: they never run,
# so they cannot meet a half-imported module. `from broker.p import x` imports broker.p.x when
# x is a module (its package's __init__ is not an edge then).


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_graph(sources: dict[str, str]) -> dict[str, set[str]]:
    """module -> the modules of `sources` it imports at run time. `from broker.p import x`
    is an import of broker.p.x when that is a module, else of broker.p (its __init__)."""
    graph: dict[str, set[str]] = {}
    for module, text in sources.items():
        targets: set[str] = set()
        for _, imported, names in _imports(ast.parse(text)):
            subs = {f"{imported}.{name}" for name in names} & sources.keys()
            targets |= subs if subs and len(subs) == len(names) else {imported, *subs}
        graph[module] = {t for t in targets if t in sources and t != module}
    return graph


def _a_cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import cycle of `graph` as [a, b, ..., a], or [] when there is none."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(module: str) -> list[str]:
        state[module] = 1
        path.append(module)
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                return [*path[path.index(target):], target]
            if target not in state and (found := visit(target)):
                return found
        path.pop()
        state[module] = 2
        return []

    for module in sorted(graph):
        if module not in state and (found := visit(module)):
            return found
    return []


def _packages() -> list[Path]:
    inside = [p for p in BROKER.iterdir() if p.is_dir() and (p / "__init__.py").exists()]
    return sorted(inside) + [ROOT / tool for tool in TOOLS]


@pytest.mark.parametrize("package", _packages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_import_cycle_inside_a_package(package: Path) -> None:
    sources = {_module_name(p): p.read_text() for p in package.rglob("*.py")}
    cycle = _a_cycle(_import_graph(sources))
    assert not cycle, f"{package.relative_to(ROOT)}: import cycle {' -> '.join(cycle)}"


def test_a_cycle_through_a_function_local_import_is_caught() -> None:
    sources = {
        "broker.p": "",
        "broker.p.app": "from broker.p import handler\n",
        "broker.p.handler": "def f():\n    from broker.p.app import ok\n",
        "broker.p.typed": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                          "    from broker.p.app import App\n",
    }
    graph = _import_graph(sources)
    assert graph["broker.p.typed"] == set()  # type-only: not an edge
    assert _a_cycle(graph) == ["broker.p.app", "broker.p.handler", "broker.p.app"]
    sources["broker.p.handler"] = "from broker.p.http import ok\n"  # helpers apart
    sources["broker.p.http"] = ""
    assert _a_cycle(_import_graph(sources)) == []
