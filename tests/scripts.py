"""The repository's scripts (examples/, benchmarks/) loaded as modules, for
tests of what they compute: they are scripts, not a package."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent


def load_script(relpath: str, name: str) -> ModuleType:
    """The script at `relpath` (from the repository's root) as module `name`."""
    spec = importlib.util.spec_from_file_location(name, ROOT / relpath)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
