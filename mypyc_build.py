"""`make compile`: the modules in broker/compiled.py's MODULES built with mypyc, in place.

    .venv/bin/python mypyc_build.py            # build (a C compiler and Python's headers)
    .venv/bin/python mypyc_build.py --clean    # remove the build: the sources run again

One shared library, `broker/_compiled__mypyc*.so`, holds the code (calls between compiled
modules are native calls); each module gets a small extension beside its .py that Python's
import system prefers. Both live inside broker/, so they are found from any directory."""

from __future__ import annotations

import importlib.util
import shutil
import sys
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

ROOT = Path(__file__).resolve().parent
GROUP = "broker._compiled"
BUILD_DIR = ROOT / "build" / "mypyc"


def _modules() -> tuple[str, ...]:
    # broker/compiled.py alone (stdlib only): importing the package would judge the build
    spec = importlib.util.spec_from_file_location("_hare_compiled", ROOT / "broker/compiled.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return tuple(module.MODULES)


def _built_files() -> list[Path]:
    # every extension module under broker/ is ours (broker has no C code of its own): one
    # left from a module since dropped from MODULES would still shadow its source
    broker = ROOT / "broker"
    return sorted({p for suffix in EXTENSION_SUFFIXES for p in broker.rglob("*" + suffix)})


def clean() -> None:
    for path in _built_files():
        path.unlink()
    shutil.rmtree(BUILD_DIR, ignore_errors=True)


def build() -> None:
    from mypyc.build import mypycify
    from setuptools import setup

    clean()
    paths = [str(Path(*name.split(".")).with_suffix(".py")) for name in _modules()]
    setup(
        name="hare-broker-compiled",
        ext_modules=mypycify(paths, group_name=GROUP, target_dir=str(BUILD_DIR / "c")),
        script_args=["-q", "build_ext", "--inplace", "--build-temp", str(BUILD_DIR / "temp"),
                     "--build-lib", str(BUILD_DIR / "lib")],
    )


if __name__ == "__main__":
    clean() if sys.argv[1:] == ["--clean"] else build()
