"""The images' Dockerfile, checked without Docker (it does not run here).

Every component's image is built from the repository root's Dockerfile with the component as a
build argument; hack/images/install.py installs it from what its pyproject.toml declares. A
build fails on a COPY source that does not exist or that .dockerignore leaves out of the
context, and an image is useless when its entrypoint is not a command its own project installs:
these checks catch both before a build.
"""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest

from tests.support.chart import REPO
from tests.support.dockerfiles import INSTALL, Dockerfile, dockerignore, images, install_py

DOCKERFILE = REPO / "Dockerfile"
COMPONENTS = {
    # directory: (image, entrypoint, other commands the image must also run)
    "sidecar": ("modelroll-sidecar", "modelroll-sidecar", ()),
    "gateway": ("modelroll-gateway", "modelroll-gateway", ()),
    "operator": ("modelroll-operator", "modelroll-operator", ()),
    "models": ("modelroll-encoder", "modelroll-encoder", ()),
    "standins": ("modelroll-demo", "modelroll-demo-model", ("modelroll-demo-llm",)),
}


def pyproject(component: str) -> dict[str, Any]:
    data: dict[str, Any] = tomllib.loads((REPO / component / "pyproject.toml").read_text())
    return data


@pytest.fixture(params=sorted(COMPONENTS))
def component(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


def test_every_copied_path_exists_and_is_in_the_build_context() -> None:
    dockerfile = Dockerfile.parse(DOCKERFILE)
    sources = dockerfile.context_sources()
    assert sources, "the Dockerfile copies nothing from the context"
    ignore = dockerignore()
    for source in sources:
        path = REPO / source
        assert path.exists(), f"the Dockerfile copies {source}, which does not exist"
        assert not ignore.excluded(source), f".dockerignore leaves {source} out of the context"
        files = [p for p in path.rglob("*") if p.is_file()] if path.is_dir() else [path]
        kept = [f for f in files if not ignore.excluded(str(f.relative_to(REPO)))]
        assert kept, f"every file under {source} is left out by .dockerignore"


def test_make_images_builds_every_component_under_its_image_name() -> None:
    """The names the chart, the examples and the node tests pull, one per component."""
    assert images() == {folder: image for folder, (image, _, _) in COMPONENTS.items()}


def project_files(component: str) -> list[Path]:
    """What building a component's project from source needs: pyproject, readme, packages."""
    project = pyproject(component)
    needed = [Path(component, "pyproject.toml")]
    if readme := project["project"].get("readme"):
        needed.append(Path(component, readme))
    packages = project["tool"]["setuptools"]["packages"]["find"]["include"]
    needed += [Path(component, p.rstrip("*")) for p in packages]
    return needed


def local_dependencies(component: str) -> list[str]:
    """Components of this repository that a component's project depends on (not on PyPI)."""
    names = {pyproject(c)["project"]["name"]: c for c in (*COMPONENTS, "common")}
    deps = pyproject(component)["project"].get("dependencies", [])
    return [names[n] for d in deps if (n := re.split(r"[\s\[<>=!~;]", d, maxsplit=1)[0]) in names]


def test_the_image_installs_the_whole_project(component: str) -> None:
    """The project and every sibling project it depends on are copied and built from source,
    each after those it depends on."""
    dockerfile = Dockerfile.parse(DOCKERFILE)
    copied = {Path(s) for s in dockerfile.context_sources()}
    installed = install_py("--projects", component)
    assert installed[-1] == component
    needed = [Path("constraints.txt"), INSTALL.relative_to(REPO)]
    for local in (component, *local_dependencies(component)):
        assert local in installed, f"the image does not build ./{local}, which {component} needs"
        for dependency in local_dependencies(local):
            assert installed.index(dependency) < installed.index(local), (local, dependency)
        needed += project_files(local)
    for path in needed:
        assert path in copied or any(parent in copied for parent in path.parents), (
            f"the Dockerfile does not copy {path}, which building {component} needs"
        )
    runs = dockerfile.all("RUN")
    assert any(f'{INSTALL.relative_to(REPO)} "$COMPONENT"' in r for r in runs), runs
    # The final stage takes the virtualenv the build stage installed the projects into.
    copies = [r for kw, r in dockerfile.final_stage() if kw == "COPY"]
    assert any(c.startswith("--from=build /opt/modelroll") for c in copies), copies
    assert '"--constraint", str(root / "constraints.txt")' in INSTALL.read_text(), (
        "dependencies are not installed at the versions pinned in constraints.txt"
    )


def test_the_entrypoint_is_a_command_the_project_installs(component: str) -> None:
    dockerfile = Dockerfile.parse(DOCKERFILE)
    final = dockerfile.final_stage()
    entrypoints = [rest for kw, rest in final if kw == "ENTRYPOINT"]
    assert len(entrypoints) == 1, "the image needs exactly one ENTRYPOINT"
    # Exec form, of the script install.py writes, which execs the command: signals reach it.
    assert json.loads(entrypoints[0]) == ["modelroll-image"]
    _, expected, others = COMPONENTS[component]
    assert pyproject(component)["tool"]["modelroll"]["image"]["command"] == expected
    scripts = pyproject(component)["project"]["scripts"]
    for command in (expected, *others):
        assert command in scripts, f"{command} is not a [project.scripts] entry of {component}"


def test_the_image_runs_as_a_non_root_user_from_a_slim_python_base() -> None:
    dockerfile = Dockerfile.parse(DOCKERFILE)
    final = dockerfile.final_stage()
    base = final[0][1]
    base = re.sub(r"\$\{(\w+)\}", lambda m: dockerfile.args()[m[1]], base)
    assert re.fullmatch(r"python:3\.\d+-slim(-\w+)?", base), base
    users = [rest for kw, rest in final if kw == "USER"]
    assert users, "the image runs as root"
    uid, _, gid = users[-1].partition(":")
    # Numeric, so that Kubernetes can check runAsNonRoot without looking inside the image.
    assert uid.isdigit(), users[-1]
    assert int(uid) != 0, users[-1]
    assert not gid or (gid.isdigit() and int(gid) != 0), users[-1]
    env = " ".join(rest for kw, rest in final if kw == "ENV")
    assert "HOME=/tmp" in env
    assert "PYTHONDONTWRITEBYTECODE=1" in env
    assert [rest for kw, rest in final if kw == "WORKDIR"][-1] == "/tmp"


def test_dockerignore_keeps_local_state_out_of_the_context() -> None:
    ignore = dockerignore()
    for path in (".git", ".venv", ".bin", ".cache", ".cluster", "tests", "bench", "hack"):
        assert ignore.excluded(path), f"{path} would be sent to the Docker daemon"
    for path in (
        "sidecar/modelroll_sidecar/__pycache__/app.cpython-311.pyc",
        "gateway/modelroll_gateway.egg-info/PKG-INFO",
    ):
        assert ignore.excluded(path), path
    assert not ignore.excluded("sidecar/modelroll_sidecar/app.py")
