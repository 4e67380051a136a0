"""The one-way layering of broker/: every import that runs (not the ones under TYPE_CHECKING)
goes from a higher layer to a strictly lower one. A new package gets a rank here, which is
where its place in the design is decided. The tools beside the broker stay beside it: the load
generator (hare_perf) imports nothing of the broker, and the broker nothing of the tools."""

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
    "protocol": 0, "config": 0, "logs": 0,
    "message": 1, "access": 1,
    # routing, stores, flow control
    "routing": 2, "store": 2, "flow": 2,
    "queue": 3,
    "server": 4, "policy": 4,
    "cluster": 5, "mgmt": 5,
    "vhost_params": 6,
    "vhost": 7, "ctl_client": 7,
    # on top: the node, its entry points, tools and connectors outside the broker
    "node": 8, "spark": 8, "ctl_access": 8, "ctl_policy": 8, "ctl_quorum": 8,
    "cli": 9, "ctl": 9, "__main__": 10,
}


def _package(path: Path) -> str:
    rel = path.relative_to(BROKER).with_suffix("")
    return rel.parts[0]


def _runtime_imports(tree: ast.Module, *, typing_too: bool = False) -> list[tuple[int, str]]:
    typing_only: set[int] = set()
    for node in ast.walk(tree):
        if typing_too:
            break
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            typing_only.update(id(n) for n in ast.walk(node))
    out = []
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        out += [(node.lineno, n) for n in names if n.split(".")[0] in ("broker", *TOOLS)]
    return out


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
PLUGINS = {"mgmt": ("cli",)}


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
