"""Write ``constraints.txt``: the exact version of every package installed in the environment
this runs in, the tested set that ``make demo`` and ``make test`` install
(``pip install -c constraints.txt``). pyproject.toml keeps ranges, so rlhfkit installs beside
other packages; the pins keep a fresh checkout on the versions its suite last passed with.

Left out: rlhfkit itself, torch (the Makefile's ``TORCH_SPEC`` chooses the build) and pip's
own tools (pip, setuptools, wheel), as ``pip freeze`` leaves them out. A release that does not
install on every Python the project supports (its ``Requires-Python``, say ">=3.11", against
pyproject's ``requires-python``) is pinned only where it installs, so an older Python still
resolves, to releases of its own.

Usage (``make constraints`` runs it in ``.venv``; ``make constraints VENV=.venv-latest`` pins
what ``make test-latest`` just passed with)::

    .venv/bin/python scripts/freeze_constraints.py [constraints.txt]
"""

from __future__ import annotations

import re
import sys
from importlib.metadata import Distribution, distributions
from pathlib import Path

from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
LEFT_OUT = {"rlhfkit", "torch", "pip", "setuptools", "wheel", "distribute"}
HEADER = """\
# The versions `make demo` and `make test` install (pip install -c constraints.txt), written by
# scripts/freeze_constraints.py from an environment the whole suite passed in (`make
# constraints`); torch is the Makefile's TORCH_SPEC. Refresh: README, "Set-up".
"""


def main(argv: list[str]) -> None:
    target = Path(argv[0]) if argv else ROOT / "constraints.txt"
    floor = python_floor(ROOT / "pyproject.toml")
    pins = sorted((pin(dist, floor) for dist in installed()), key=str.lower)
    target.write_text(HEADER + "".join(f"{line}\n" for line in pins))
    print(f"{target}: {len(pins)} packages pinned")


def python_floor(pyproject: Path) -> str:
    """The oldest Python the project supports (``requires-python = ">=3.10"``)."""
    found = re.search(r'^requires-python\s*=\s*">=\s*([\d.]+)"', pyproject.read_text(), re.M)
    if found is None:
        raise SystemExit(f'{pyproject}: no requires-python = ">=X.Y" line')
    return found.group(1)


def installed() -> list[Distribution]:
    """Every distribution of this environment, but those ``LEFT_OUT``, once each (the one
    found first on the path, the one Python imports)."""
    by_name: dict[str, Distribution] = {}
    for dist in distributions():
        by_name.setdefault(canonicalize_name(dist.metadata["Name"]), dist)
    return [dist for name, dist in by_name.items() if name not in LEFT_OUT]


def pin(dist: Distribution, floor: str) -> str:
    """``name==version``, with a marker where the release does not install on every Python
    from ``floor`` on: anything but a lower bound at or below it."""
    line = f"{dist.metadata['Name']}=={dist.version}"
    requires = SpecifierSet(dist.metadata.get("Requires-Python") or "")
    plain = all(s.operator in (">=", ">") for s in requires) and requires.contains(f"{floor}.0")
    if plain:
        return line
    marker = " and ".join(f'python_full_version {s.operator} "{s.version}"' for s in requires)
    return f"{line}; {marker}"


if __name__ == "__main__":
    main(sys.argv[1:])
