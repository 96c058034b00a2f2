"""``make gpu-bench-prep``: what the GPU benchmark (``bench/gpu/run.sh``) needs on a GPU machine
that has PyTorch but no network, in ``.gpu-carry/`` (git-ignored): the model zip with fp16 weights,
and wheels of the Python packages that machine's image lacks. Checks that the working tree and
the folder fit what a device call may carry, and prints the call.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

from modelroll_models.model_files import default_zip_path, write_half_zip

from .gpu import Options

CARRY = Path(".gpu-carry")
WHEELS = CARRY / "wheels"
REQUIREMENTS = WHEELS / "requirements.txt"
MISSING_THERE = ("orjson", "cryptography", "cffi", "pycparser", "tokenizers")
"""What the benchmark's processes import beyond the GPU machine's image (its package list in
the device guide): orjson (the sidecar and the encoder), cryptography and its cffi and pycparser
(modelroll_devcluster, through the bench's process helpers); tokenizers the image has, and
travels in case another image lacks it. modelroll's own packages run from the working tree."""
DEVICE_PYTHON = "3.12"
"""The GPU machine's python3 (3.12.3 there)."""
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")
CARRY_LIMIT_BYTES = 64 << 20
"""A device call carries the working tree and the named ignored folders, 64 MiB together."""
RUN_TIMEOUT_S = 540
"""The device call's limit: run.sh ends itself by 490 s, which leaves time to return $OUT."""


class TooLarge(Exception):
    """The working tree and the carry folder exceed what a device call may carry."""


def pins(constraints: Path) -> dict[str, str]:
    """``name==version`` lines of a constraints file, by lowercased name."""
    found = {}
    for line in constraints.read_text().splitlines():
        name, sep, version = line.partition("==")
        if sep and not line.startswith("#"):
            found[name.strip().lower().replace("_", "-")] = version.strip()
    return found


def download_wheels(names: Iterable[str], constraints: Path, pythons: Iterable[str]) -> None:
    """Binary wheels of ``names`` at their pinned versions for x86-64 Linux and each of
    ``pythons``, into ``WHEELS``, with the requirements file run.sh installs from."""
    pinned = pins(constraints)
    wanted = [f"{name}=={pinned[name]}" for name in names]
    WHEELS.mkdir(parents=True, exist_ok=True)
    for python in pythons:
        platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
        subprocess.run(
            [
                *(sys.executable, "-m", "pip", "download", "--quiet", "--no-deps"),
                *("--only-binary=:all:", "--implementation", "cp", "--python-version", python),
                *platforms,
                *("--dest", str(WHEELS), *wanted),
            ],
            check=True,
        )
    REQUIREMENTS.write_text("".join(f"{name}\n" for name in names))


def git_files(root: Path) -> list[Path]:
    """What a device call sends of the checkout: tracked files and untracked ones not ignored."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=root,
        capture_output=True,
        check=True,
    ).stdout
    return [root / name for name in listed.decode().split("\0") if name]


def carried_bytes(files: Iterable[Path], carried: Iterable[Path]) -> int:
    """The bytes of ``files`` (those that exist) and of every file under ``carried``."""
    total = sum(f.stat().st_size for f in files if f.is_file() and not f.is_symlink())
    for folder in carried:
        total += sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
    return total


def check_size(total: int, limit: int = CARRY_LIMIT_BYTES) -> None:
    if total > limit:
        raise TooLarge(
            f"the working tree and {CARRY}/ come to {total / 2**20:.1f} MiB, over the "
            f"{limit / 2**20:.0f} MiB a device call carries: remove what is not needed"
        )


def device_call(commit: str) -> str:
    """The ``run`` call that runs the benchmark on the GPU machine."""
    return (
        f"run(command='MODELROLL_COMMIT={commit} bash bench/gpu/run.sh', "
        f'carry=["{CARRY}"], timeout_s={RUN_TIMEOUT_S})'
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m modelroll_bench.gpu_carry", description=__doc__
    )
    parser.add_argument("--constraints", type=Path, default=Path("constraints.txt"))
    args = parser.parse_args(argv)
    zip_path = Options().model_zip
    if not zip_path.is_file():
        CARRY.mkdir(exist_ok=True)
        write_half_zip(default_zip_path(), zip_path)
    local = f"{sys.version_info.major}.{sys.version_info.minor}"
    download_wheels(MISSING_THERE, args.constraints, sorted({DEVICE_PYTHON, local}))
    total = carried_bytes(git_files(Path()), [CARRY])
    try:
        check_size(total)
    except TooLarge as exc:
        parser.exit(1, f"{parser.prog}: {exc}\n")
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    print(f"{CARRY}/ is ready; with the working tree it comes to {total / 2**20:.1f} MiB.")
    print("On a session with a GPU machine, from this checkout's repository root:")
    print(f"  {device_call(commit)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
