"""The harness a ``modelroll-bench`` suite runs in.

A suite declares its arguments and turns them into a setup, measures (its rounds, as a typed
record), summarizes what it measured (pure arithmetic, tested without timing anything), renders
the summary as the tables docs/performance.md shows (and plots, where it draws any), and names its
targets. The harness does the rest the same way for every suite: the machine and commit measured,
the JSON in bench/results/ (setup, measurements, summary and targets; ``--from`` reads one back
and summarizes it again without measuring), and the verdicts, exiting 0 only when every target
was met.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar

from . import results
from .runs import machine
from .servers import Check

SetupT = TypeVar("SetupT")
MeasuredT = TypeVar("MeasuredT")
SummaryT = TypeVar("SummaryT")


@dataclass(frozen=True)
class Target:
    target: str
    met: bool
    measured: str


@dataclass(frozen=True)
class Report(Generic[SetupT, MeasuredT, SummaryT]):
    """What a suite writes to bench/results/."""

    suite: str
    setup: SetupT
    measured: MeasuredT
    summary: SummaryT
    targets: list[Target] = field(default_factory=list)
    machine: dict[str, Any] = field(default_factory=dict)


class Suite(ABC, Generic[SetupT, MeasuredT, SummaryT]):
    """One benchmark: a ``modelroll-bench`` subcommand."""

    name: ClassVar[str]
    """The subcommand."""
    help: ClassVar[str]
    """One line for ``modelroll-bench --help``."""
    description: ClassVar[str]
    """The subcommand's ``--help`` text: what it measures and how."""
    setup_type: ClassVar[type[Any]]
    measured_type: ClassVar[type[Any]]

    @abstractmethod
    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """The suite's own flags (the harness adds ``--out`` and ``--from``)."""

    @abstractmethod
    def setup(self, args: argparse.Namespace) -> SetupT:
        """The setup the flags ask for; a contradiction fails here, before anything starts."""

    @abstractmethod
    async def measure(self, setup: SetupT) -> MeasuredT:
        """Run the servers and the load: every round, as measured."""

    @abstractmethod
    def summarize(self, setup: SetupT, measured: MeasuredT) -> SummaryT:
        """Medians, ranges and ratios over the rounds."""

    @abstractmethod
    def render(self, setup: SetupT, summary: SummaryT) -> str:
        """The summary as tables (Markdown, as docs/performance.md shows them)."""

    @abstractmethod
    def checks(self, setup: SetupT, summary: SummaryT) -> list[Check]:
        """The targets: (what, met, what was measured)."""

    def again(self, setup: SetupT, args: argparse.Namespace) -> SetupT:
        """The setup of a saved result, with what this run's flags may change in it when it is
        summarized again (``--from``): nothing, unless the suite says so."""
        return setup

    def plot(self, setup: SetupT, summary: SummaryT, args: argparse.Namespace) -> list[Path]:
        """Draw the summary's plots; the files written (none, unless the suite draws any)."""
        return []

    def default_out(self) -> Path:
        return Path(f"bench/results/{self.name}.json")

    def add_harness_arguments(self, parser: argparse.ArgumentParser) -> None:
        self.add_arguments(parser)
        parser.add_argument("--out", type=Path, default=self.default_out(), help="results file")
        parser.add_argument(
            "--from",
            dest="saved",
            type=Path,
            metavar="JSON",
            help="summarize a results file this suite wrote (its --out) again, measuring nothing",
        )

    def read(self, path: Path) -> tuple[SetupT, MeasuredT, dict[str, Any]]:
        """The setup, measurements and machine of a results file this suite wrote."""
        data = json.loads(path.read_text())
        if data.get("suite") != self.name:
            raise SystemExit(f"{path}: not a {self.name} result (suite {data.get('suite')!r})")
        setup: SetupT = results.from_json(self.setup_type, data["setup"])
        measured: MeasuredT = results.from_json(self.measured_type, data["measured"])
        return setup, measured, data.get("machine", {})

    def main(self, args: argparse.Namespace) -> int:
        """Measure (or read ``--from``), summarize, print the tables, write, and judge."""
        if args.saved is not None:
            setup, measured, measured_on = self.read(args.saved)
            setup = self.again(setup, args)
        else:
            setup = self.setup(args)
            measured = asyncio.run(self.measure(setup))
            measured_on = machine()
        summary = self.summarize(setup, measured)
        found = self.checks(setup, summary)
        print(self.render(setup, summary))
        written = self.plot(setup, summary, args)
        if written:
            print("Plots: " + ", ".join(str(p) for p in written))
        targets = [Target(*check) for check in found]
        results.write(Report(self.name, setup, measured, summary, targets, measured_on), args.out)
        if found:
            print("\nTargets:")
        for target, ok, measured_text in found:
            print(f"  [{'met' if ok else 'MISSED'}] {target}: {measured_text}")
        print(f"Results in {args.out}")
        return 0 if all(ok for _, ok, _ in found) else 1


def register(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], suite: Suite[Any, Any, Any]
) -> None:
    """Add ``suite`` as a subcommand of ``modelroll-bench``."""
    parser = sub.add_parser(
        suite.name,
        help=suite.help,
        description=suite.description,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    suite.add_harness_arguments(parser)
    parser.set_defaults(func=suite.main)


def markdown(head: list[str], rows: list[list[str]]) -> str:
    """A Markdown table."""
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)
