"""The images' Dockerfiles and .dockerignore, parsed as Docker reads them (Docker does not run
here), and what hack/images/install.py installs for each component."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.chart import REPO


@dataclass
class Dockerfile:
    path: Path
    instructions: list[tuple[str, str]] = field(default_factory=list)

    @classmethod
    def parse(cls, path: Path) -> Dockerfile:
        """Instructions with continuation lines joined and comments dropped."""
        parsed = cls(path)
        pending = ""
        for raw in path.read_text().splitlines():
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            if line.endswith("\\"):
                pending += line[:-1] + " "
                continue
            line = pending + line
            pending = ""
            keyword, _, rest = line.partition(" ")
            parsed.instructions.append((keyword.upper(), rest.strip()))
        assert not pending, f"{path}: dangling line continuation"
        return parsed

    def all(self, keyword: str) -> list[str]:
        return [rest for kw, rest in self.instructions if kw == keyword]

    def context_sources(self) -> list[str]:
        """Paths that COPY/ADD take from the build context (not from another stage)."""
        sources: list[str] = []
        for keyword in ("COPY", "ADD"):
            for rest in self.all(keyword):
                words = shlex.split(rest)
                if any(w.startswith("--from=") for w in words):
                    continue
                paths = [w for w in words if not w.startswith("--")]
                sources += paths[:-1]
        return sources

    def final_stage(self) -> list[tuple[str, str]]:
        last_from = max(i for i, (kw, _) in enumerate(self.instructions) if kw == "FROM")
        return self.instructions[last_from:]

    def args(self) -> dict[str, str]:
        values = {}
        for rest in self.all("ARG"):
            name, _, default = rest.partition("=")
            values[name] = default
        return values


class DockerIgnore:
    """.dockerignore rules as Docker applies them: the last matching pattern wins, and a pattern
    that matches a directory matches everything below it."""

    def __init__(self, text: str) -> None:
        self.rules: list[tuple[re.Pattern[str], bool]] = []
        for raw in text.splitlines():
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            negated = line.startswith("!")
            pattern = line.lstrip("!").strip("/")
            self.rules.append((re.compile(self._regex(pattern)), negated))

    @staticmethod
    def _regex(pattern: str) -> str:
        out = ""
        i = 0
        while i < len(pattern):
            if pattern.startswith("**/", i):
                out += "(?:.*/)?"
                i += 3
            elif pattern.startswith("**", i):
                out += ".*"
                i += 2
            elif pattern[i] == "*":
                out += "[^/]*"
                i += 1
            elif pattern[i] == "?":
                out += "[^/]"
                i += 1
            else:
                out += re.escape(pattern[i])
                i += 1
        return f"^{out}$"

    def excluded(self, path: str) -> bool:
        parts = path.strip("/").split("/")
        candidates = ["/".join(parts[: n + 1]) for n in range(len(parts))]
        result = False
        for regex, negated in self.rules:
            if any(regex.match(c) for c in candidates):
                result = not negated
        return result


def dockerignore() -> DockerIgnore:
    return DockerIgnore((REPO / ".dockerignore").read_text())


INSTALL = REPO / "hack" / "images" / "install.py"


def install_py(*args: str) -> list[str]:
    """The lines hack/images/install.py prints (``--images``, ``--projects COMPONENT``)."""
    out = subprocess.run(
        [sys.executable, str(INSTALL), *args], capture_output=True, text=True, check=True
    ).stdout
    return out.splitlines()


def images() -> dict[str, str]:
    """Image name by component folder, as the components' pyproject.toml files declare them."""
    return dict(line.split(" ", 1) for line in install_py("--images"))
