"""The flag tables of the commands' READMEs, written from the commands' own argparse parsers.

Each row is one option: its flags, its ``MODELROLL_*`` variable (for a command parsed by
``modelroll_common.flags.EnvArgumentParser``), its default and its help text, so ``--help`` and
the README say the same. ``kubectl modelroll`` also gets the table of its subcommands. Each table
follows its marker line in its README and runs to the first line that is not a table row
(``reference.splice``); the prose around it is edited by hand.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

from reference import splice

from modelroll_common.flags import PREFIX, EnvArgumentParser, env_name, shown_default
from modelroll_common.settings import BY_ATTR, CHOICES_BY_ATTR
from modelroll_gateway import cli as gateway_cli
from modelroll_models import cli as encoder_cli
from modelroll_operator import cli as operator_cli
from modelroll_operator.plugin import cli as plugin_cli
from modelroll_sidecar import config as sidecar_config

ROOT = Path(__file__).resolve().parents[1]

STAND_INS = {
    "modelroll-demo-model": ("modelroll_standins.model", "standins/README.md"),
    "modelroll-demo-llm": ("modelroll_standins.llm", "standins/README.md"),
}
"""The stand-in model servers: command, the module whose ``parse_args`` builds its parser, and
the README its table is in."""

SETTINGS_FLAGS = frozenset(
    [*(s.flag for s in BY_ATTR.values()), *(c.flag for c in CHOICES_BY_ATTR.values())]
)
"""The sidecar flags a ModelVersion sets: their table comes from the settings (reference.py)."""


def marker(command: str) -> str:
    return f"<!-- make generate writes the table below from {command}'s parser -->"


def commands_marker(command: str) -> str:
    return f"<!-- make generate writes the table below from {command}'s subcommands -->"


def _no_variables() -> dict[str, str]:
    """The environment without MODELROLL_* variables: defaults as a fresh shell sees them."""
    return {k: v for k, v in os.environ.items() if not k.startswith(PREFIX)}


class _Caught(Exception):
    pass


def parser_built_by(parse_args: Callable[[list[str]], object]) -> argparse.ArgumentParser:
    """The parser a ``parse_args`` function builds inside itself, taken as it parses."""
    caught: list[argparse.ArgumentParser] = []

    def catch(self: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> Any:
        caught.append(self)
        raise _Caught

    with (
        mock.patch.dict(os.environ, _no_variables(), clear=True),
        mock.patch.object(argparse.ArgumentParser, "parse_args", catch),
        contextlib.suppress(_Caught),
    ):
        parse_args([])
    if not caught:
        raise AssertionError(f"{parse_args.__module__}.parse_args built no parser")
    return caught[0]


def stand_in(command: str) -> Callable[[], argparse.ArgumentParser]:
    module = STAND_INS[command][0]
    return lambda: parser_built_by(importlib.import_module(module).parse_args)


@dataclass(frozen=True)
class Command:
    name: str
    readme: Path
    parser: Callable[[], argparse.ArgumentParser]
    leave_out: frozenset[str] = frozenset()
    """Flags whose rows another table holds."""


COMMANDS = (
    Command(
        "modelroll-sidecar",
        ROOT / "sidecar" / "README.md",
        lambda: sidecar_config.build_parser(_no_variables()),
        SETTINGS_FLAGS,
    ),
    Command(
        "modelroll-gateway",
        ROOT / "gateway" / "README.md",
        lambda: gateway_cli.build_parser(_no_variables()),
    ),
    Command(
        "modelroll-operator",
        ROOT / "operator" / "README.md",
        lambda: operator_cli.build_parser(_no_variables()),
    ),
    Command("kubectl modelroll", ROOT / "operator" / "README.md", plugin_cli.build_parser),
    Command("modelroll-encoder", ROOT / "models" / "README.md", encoder_cli.build_parser),
    *(Command(name, ROOT / readme, stand_in(name)) for name, (_, readme) in STAND_INS.items()),
)


# -- cells -------------------------------------------------------------------------------------

_CODE = re.compile(r"(?<![\w`-])(--?[a-zA-Z][a-z0-9-]*|modelroll_[a-z0-9_]+)(?![\w`-])")
"""Flags and metric names, which a table shows as code."""


def cell(text: str) -> str:
    """Help text as a table cell: flags and metric names in backticks, ``|`` escaped."""
    return _CODE.sub(r"`\1`", text).replace("|", "\\|")


def literal(value: object) -> str:
    """A default as the docs write it (``30``, not ``30.0``), or "" for none worth showing."""
    if value is None or value is argparse.SUPPRESS or value == "" or value == []:
        return ""
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float) and value.is_integer():
        return f"`{int(value)}`"
    if isinstance(value, list | tuple):
        return "`" + ",".join(str(v) for v in value) + "`"
    return f"`{value}`"


_DEFAULT_NOTE = re.compile(r"\s*\(default: ([^()]*)\)$")
"""How the help of a plain ArgumentParser's option words its default: ``(default: 30)``."""


def help_text(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    """The option's help, its ``%(default)s`` and the like filled in as ``--help`` does."""
    return argparse.HelpFormatter(parser.prog)._expand_help(action) if action.help else ""


def default(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    """The default cell: the words ``show_default`` gave it, else the literal default, else the
    help's closing ``(default: ...)``."""
    words = shown_default(action)
    if words is not None:
        return cell(words)
    note = _DEFAULT_NOTE.search(help_text(parser, action))
    return literal(action.default) or (cell(note.group(1)) if note else "")


def meaning(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    """The option's help, less a closing ``(default: ...)``: the default has its own cell."""
    return cell(_DEFAULT_NOTE.sub("", help_text(parser, action)))


def variable(action: argparse.Action) -> str:
    name = f"`{env_name(action)}`"
    if isinstance(action, argparse._AppendAction):
        return f"{name} (comma-separated)"
    if action.nargs == 0:
        return f"{name} (a switch)"
    return name


def flags(action: argparse.Action) -> str:
    return ", ".join(f"`{o}`" for o in action.option_strings)


# -- tables ------------------------------------------------------------------------------------


def options(parser: argparse.ArgumentParser) -> Iterator[argparse.Action]:
    """The parser's options, --help and --version aside."""
    for action in parser._actions:
        if action.option_strings and not isinstance(
            action, argparse._HelpAction | argparse._VersionAction
        ):
            yield action


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    found: dict[str, argparse.ArgumentParser] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            found.update(action.choices)
    return found


def flag_rows(command: Command) -> list[str]:
    """A command's flags: flag, variable (when it reads any), default, meaning."""
    parser = command.parser()
    if subcommands(parser):
        return subcommand_flag_rows(parser)
    reads_variables = isinstance(parser, EnvArgumentParser)
    header = ["flag", "variable", "default", "meaning"] if reads_variables else ["flag"]
    if not reads_variables:
        header += ["default", "meaning"]
    rows = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for action in options(parser):
        if set(action.option_strings) & command.leave_out:
            continue
        cells = [flags(action)]
        if reads_variables:
            cells.append(variable(action))
        cells += [default(parser, action), meaning(parser, action)]
        rows.append("| " + " | ".join(cells) + " |")
    return rows


def subcommand_flag_rows(parser: argparse.ArgumentParser) -> list[str]:
    """The flags of a command with subcommands: flag, the subcommands that take it, default,
    meaning. A flag of the command itself that every subcommand also takes is taken "before or
    after the command"."""
    subs = subcommands(parser)
    taken: dict[tuple[tuple[str, ...], str], list[str]] = {}
    first: dict[tuple[tuple[str, ...], str], tuple[argparse.ArgumentParser, argparse.Action]] = {}
    for name, sub in [("", parser), *subs.items()]:
        for action in options(sub):
            key = (tuple(action.option_strings), action.help or "")
            taken.setdefault(key, []).append(name)
            if key not in first or action.default is not argparse.SUPPRESS:
                first.setdefault(key, (sub, action))
    rows = ["| flag | commands | default | meaning |", "|---|---|---|---|"]
    for key, names in taken.items():
        sub, action = first[key]
        if names == ["", *subs]:
            where = "all, before or after the command"
        elif names == [""]:
            where = "before the command"
        else:
            where = ", ".join(f"`{n}`" for n in names)
        cells = [flags(action), where, default(sub, action), meaning(sub, action)]
        rows.append("| " + " | ".join(cells) + " |")
    return rows


def usage(name: str, parser: argparse.ArgumentParser) -> str:
    """``set-weight VERSION WEIGHT``: a subcommand with its positional arguments."""
    words = [name]
    for action in parser._actions:
        if action.option_strings:
            continue
        if action.choices is not None:
            word = "{" + ",".join(str(c) for c in action.choices) + "}"
        else:
            word = action.metavar if isinstance(action.metavar, str) else action.dest.upper()
        words.append(f"[{word}]" if action.nargs == "?" else word)
    return " ".join(words)


def command_rows(parser: argparse.ArgumentParser) -> list[str]:
    """A command's subcommands: how each is called, and what it does (its help, and the help of
    an argument that chooses among actions)."""
    helps = {
        a.dest: a.help or ""
        for action in parser._actions
        if isinstance(action, argparse._SubParsersAction)
        for a in action._choices_actions
    }
    rows = ["| command | what it does |", "|---|---|"]
    for name, sub in subcommands(parser).items():
        what = [helps.get(name, "")]
        what += [a.help for a in sub._actions if a.choices is not None and a.help]
        rows.append(f"| `{usage(name, sub)}` | {cell('; '.join(what))} |")
    return rows


def outputs(documents: dict[Path, str]) -> dict[Path, str]:
    """``documents`` (path to text, read from disk when absent) with every flag table written."""
    out = dict(documents)
    for command in COMMANDS:
        text = out.get(command.readme) or command.readme.read_text()
        text = splice(text, flag_rows(command), command.readme, marker(command.name))
        if subcommands(parser := command.parser()):
            rows = command_rows(parser)
            text = splice(text, rows, command.readme, commands_marker(command.name))
        out[command.readme] = text
    return out
