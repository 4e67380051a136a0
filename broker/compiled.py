"""The hot modules that `make compile` builds with mypyc, and which build is running.

The .py files stay the source of truth: `make compile` (mypyc_build.py) writes an extension
module beside each one listed here (`broker/message.cpython-311-x86_64-linux-gnu.so`, ...) and
one shared library (`broker/_compiled__mypyc...so`); Python's import system prefers an
extension module to the source beside it. Without a build (no C compiler, or never run), the
sources run, with the same behaviour. `broker/__init__.py` makes the sources run anyway when
`HARE_PURE_PYTHON` is set (CI's fallback tests) or when a source is newer than its build (a
stale build would run old code)."""

from __future__ import annotations

import importlib.machinery
import sys
from pathlib import Path

__all__ = ["MODULES", "built", "loaded", "prefer_source", "stale"]

# In the order profiling picked them, by own time (docs/BENCHMARKS.md, "Compiled with
# mypyc"). Not broker/server/reader.py: its Reader subclasses asyncio.Protocol, which makes it
# a plain Python class under mypyc, and compiled it cost more instructions a publish, not less.
MODULES: tuple[str, ...] = (
    "broker.server.channel",
    "broker.queue.variable_queue",
    "broker.flow.credit_flow",  # with amqqueue: its _QueueCredit subclasses CreditFlow
    "broker.queue.amqqueue",
    "broker.protocol.frames",
    "broker.message",
    "broker.flow.mailbox",
    "broker.routing.router",
    "broker.protocol.command_assembler",
    # the delivery path: every delivery calls the writer and reads the consumer and the clock
    "broker.server.writer",
    "broker.queue.consumer",
    "broker.flow.loop_ticks",
)

_ROOT = Path(__file__).resolve().parent.parent
_EXT = importlib.machinery.EXTENSION_SUFFIXES[0]


def _paths(module: str) -> tuple[Path, Path]:
    base = _ROOT.joinpath(*module.split("."))
    return base.with_suffix(".py"), base.with_name(base.name + _EXT)


def built() -> list[str]:
    """The listed modules that have an extension module beside their source."""
    return [m for m in MODULES if _paths(m)[1].exists()]


def stale() -> list[str]:
    """Built modules whose source changed after the build: running them would run old code."""
    out = []
    for m in MODULES:
        src, ext = _paths(m)
        try:
            if src.stat().st_mtime > ext.stat().st_mtime:
                out.append(m)
        except FileNotFoundError:
            continue
    return out


def loaded() -> list[str]:
    """The listed modules imported from an extension module in this process."""
    return [
        m for m in MODULES
        if m in sys.modules and str(getattr(sys.modules[m], "__file__", "")).endswith(_EXT)
    ]


def prefer_source() -> None:
    """Import broker's modules from their .py files, whatever is built beside them: a path
    hook for broker's own directories that knows only source and bytecode loaders."""
    broker_dir = str(_ROOT / "broker")
    source_only = importlib.machinery.FileFinder.path_hook(
        (importlib.machinery.SourceFileLoader, importlib.machinery.SOURCE_SUFFIXES),
        (importlib.machinery.SourcelessFileLoader, importlib.machinery.BYTECODE_SUFFIXES),
    )

    def hook(path: str) -> importlib.machinery.FileFinder:
        if not _inside(str(Path(path).resolve()), broker_dir):
            raise ImportError("not one of broker's directories")
        return source_only(path)

    sys.path_hooks.insert(0, hook)
    for path in list(sys.path_importer_cache):
        if _inside(path, broker_dir):
            del sys.path_importer_cache[path]


def _inside(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory + "/")
