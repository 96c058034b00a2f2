"""What the Dockerfile installs for a component, read from the component's pyproject.toml.

A component with an image declares it in its pyproject.toml:

    [tool.modelroll.image]
    name = "modelroll-gateway"        # the image's name (make images adds registry and tag)
    command = "modelroll-gateway"     # the image's entrypoint: one of its [project.scripts]
    no-deps = []                      # packages installed without their dependencies

The image installs the component's project and every project of this repository it depends on,
directly or through another (their folders hold a pyproject.toml whose [project] name is the
dependency's), at the versions pinned in constraints.txt.

    install.py COMPONENT VENV   install into the virtualenv VENV (in the image's build stage) and
                                write VENV/bin/modelroll-image, the entrypoint that runs `command`
    install.py --images         one line per component with an image: its folder and image name
    install.py --projects COMPONENT   the folders install.py installs for it, one a line

Runs with Python 3.11's standard library alone (the image's python3, or the host's).
"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
ENTRYPOINT = "modelroll-image"


def pyproject(folder: Path) -> dict[str, Any]:
    data: dict[str, Any] = tomllib.loads((folder / "pyproject.toml").read_text())
    return data


def projects(root: Path) -> dict[str, Path]:
    """This repository's projects by their [project] name: the top-level folders with one."""
    found = {}
    for path in sorted(root.glob("*/pyproject.toml")):
        found[pyproject(path.parent)["project"]["name"]] = path.parent
    return found


def requirement_name(requirement: str) -> str:
    """``modelroll-common[kube]>=1; extra`` -> ``modelroll-common``."""
    return re.split(r"[\s\[<>=!~;]", requirement, maxsplit=1)[0]


def local_projects(root: Path, component: str) -> list[Path]:
    """The component's folder after the folders of the projects it depends on, each once."""
    by_name = projects(root)
    ordered: list[Path] = []

    def visit(folder: Path) -> None:
        if folder in ordered:
            return
        for requirement in pyproject(folder)["project"].get("dependencies", []):
            if (name := requirement_name(requirement)) in by_name:
                visit(by_name[name])
        ordered.append(folder)

    visit(root / component)
    return ordered


def image(folder: Path) -> dict[str, Any] | None:
    """The component's [tool.modelroll.image] table; None for a project without an image."""
    table: dict[str, Any] | None = (
        pyproject(folder).get("tool", {}).get("modelroll", {}).get("image")
    )
    return table


def images(root: Path) -> list[tuple[str, str]]:
    """(folder, image name) of every component with an image."""
    return [
        (folder.name, table["name"])
        for folder in projects(root).values()
        if (table := image(folder)) is not None
    ]


def install(root: Path, component: str, venv: Path) -> None:
    table = image(root / component)
    if table is None:
        sys.exit(f"{component}/pyproject.toml declares no [tool.modelroll.image]")
    if table["command"] not in pyproject(root / component)["project"].get("scripts", {}):
        sys.exit(f"{component}'s image command {table['command']} is not one of its scripts")
    pip = [str(venv / "bin" / "pip"), "install", "--constraint", str(root / "constraints.txt")]
    folders = [f"./{folder.relative_to(root)}" for folder in local_projects(root, component)]
    subprocess.run([*pip, *folders], cwd=root, check=True)
    if table.get("no-deps"):
        subprocess.run([*pip, "--no-deps", *table["no-deps"]], cwd=root, check=True)
    entrypoint = venv / "bin" / ENTRYPOINT
    # exec: the command replaces the shell, so signals reach it directly.
    entrypoint.write_text(f'#!/bin/sh\nexec {venv / "bin" / table["command"]} "$@"\n')
    entrypoint.chmod(0o755)


def main(argv: list[str]) -> None:
    if argv == ["--images"]:
        for folder, name in images(ROOT):
            print(folder, name)
    elif len(argv) == 2 and argv[0] == "--projects":
        for path in local_projects(ROOT, argv[1]):
            print(path.relative_to(ROOT))
    elif len(argv) == 2:
        install(ROOT, argv[0], Path(argv[1]))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
