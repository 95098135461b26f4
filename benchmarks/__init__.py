"""The benchmark scripts, run as `python benchmarks/<name>.py`, and imported by the tests as
`from benchmarks import study`.

A script imports its siblings by their file names (`import provenance`), since Python puts the
script's folder first on its path. Imported as this package, they need that folder on the path
too, and `benchmarks.study` is the module `study` itself, so that no script is loaded twice under
two names (a test that patches one would miss the other).
"""

import importlib
import sys
from pathlib import Path
from types import ModuleType

FOLDER = Path(__file__).resolve().parent
if str(FOLDER) not in sys.path:
    sys.path.insert(0, str(FOLDER))  # first, as for a script


def __getattr__(name: str) -> ModuleType:
    if not (FOLDER / f"{name}.py").is_file():
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return importlib.import_module(name)
