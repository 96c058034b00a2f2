"""Command-line parsing shared by modelroll's commands: every flag also has a MODELROLL_* variable.

:class:`EnvArgumentParser` is an :class:`argparse.ArgumentParser` whose every option
(``--max-wait-ms``) can also be set by its variable (``MODELROLL_MAX_WAIT_MS``), named after the
option's first long name. The command line wins: a flag replaces its variable, never adds to it
(a repeatable flag too), and a flag of a mutually exclusive group also sets aside its partners'
variables; two partners' variables that both set something are refused. Variables are read when
the arguments are parsed:

- a boolean flag's variable accepts 1/0, true/false, yes/no or on/off (any case);
- a repeatable (``action="append"``) flag's variable is a comma-separated list;
- any other flag's variable is one value, converted and checked like the flag's.

A bad value is refused (exit status 2) naming where it came from: ``--workers abc: invalid
positive integer`` or ``MODELROLL_WORKERS=abc: invalid positive integer``. ``--help`` shows each
flag's default and its variable; :func:`show_default` words a default that is worked out later.
"""

from __future__ import annotations

import argparse
import copy
import math
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NoReturn, TypeVar

PREFIX = "MODELROLL_"
_T = TypeVar("_T")
_SHOWN_DEFAULT = "modelroll_shown_default"
_FLAG = re.compile(r"(?<![\w-])--[a-z0-9](?:[a-z0-9-]*[a-z0-9])?")
BOOLEANS = {
    "1": True,
    "true": True,
    "yes": True,
    "on": True,
    "0": False,
    "false": False,
    "no": False,
    "off": False,
}


def _checked(
    kind: Callable[[str], _T], ok: Callable[[_T], bool], problem: str
) -> Callable[[str], _T]:
    """A flag type: ``kind(text)`` when it converts and passes ``ok``, else ``problem``."""

    def convert(text: str) -> _T:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(problem) from None
        if not ok(value):
            raise argparse.ArgumentTypeError(problem)
        return value

    return convert


positive_int = _checked(int, lambda v: v > 0, "invalid positive integer")
non_negative_int = _checked(int, lambda v: v >= 0, "invalid non-negative integer")
positive_float = _checked(float, lambda v: math.isfinite(v) and v > 0, "invalid positive number")
number = _checked(float, math.isfinite, "invalid number")
"""A finite float (float() also takes "nan" and "inf")."""
port_number = _checked(int, lambda v: 0 <= v <= 65535, "invalid port number (0 to 65535)")


def boolean(text: str) -> bool:
    try:
        return BOOLEANS[text.strip().lower()]
    except KeyError:
        raise argparse.ArgumentTypeError(
            "invalid boolean (use 1/0, true/false, yes/no or on/off)"
        ) from None


def show_default(action: argparse.Action, text: str) -> argparse.Action:
    """Let ``--help`` show ``text`` as the default of ``action``'s flag, for a default that is
    worked out after parsing (None, [], False standing for something)."""
    setattr(action, _SHOWN_DEFAULT, text)
    return action


def shown_default(action: argparse.Action) -> str | None:
    """The words :func:`show_default` gave ``action``'s default, or None."""
    shown: str | None = getattr(action, _SHOWN_DEFAULT, None)
    return shown


def long_option(action: argparse.Action) -> str:
    """The name errors and variables use: the first ``--long`` option string."""
    return next((o for o in action.option_strings if o.startswith("--")), action.option_strings[0])


def env_name(action: argparse.Action) -> str:
    """``--max-wait-ms`` -> ``MODELROLL_MAX_WAIT_MS``."""
    return PREFIX + long_option(action).lstrip("-").replace("-", "_").upper()


def default_text(action: argparse.Action) -> str:
    shown = shown_default(action)
    if shown is not None:
        return shown
    default = action.default
    if isinstance(default, bool):
        return "on" if default else "off"
    if isinstance(default, list | tuple):
        return ",".join(str(item) for item in default) or "none"
    return "none" if default is None else str(default)


def _settable(action: argparse.Action) -> bool:
    """An option with a value of its own (not --help or --version)."""
    return bool(action.option_strings) and action.default is not argparse.SUPPRESS


def _repeatable(action: argparse.Action) -> bool:
    return isinstance(action, argparse._AppendAction)  # append and extend


class EnvHelpFormatter(argparse.HelpFormatter):
    """Ends each option's help with ``(default: ...; env MODELROLL_...)``."""

    def _format_action(self, action: argparse.Action) -> str:
        if _settable(action):  # a flag without help too
            extra = f"default: {default_text(action)}; env {env_name(action)}"
            action = copy.copy(action)
            # The formatter %-formats help strings (%(default)s and the like).
            action.help = f"{action.help or ''} ({extra.replace('%', '%%')})".lstrip()
        return super()._format_action(action)


class EnvArgumentParser(argparse.ArgumentParser):
    """An ArgumentParser whose options fall back on MODELROLL_* variables (see the module).

    ``environ``: where variables are read (default: ``os.environ`` at parse time). After parsing,
    :meth:`reject` reports a problem found in the parsed values against their variables.
    """

    def __init__(self, *args: Any, environ: Mapping[str, str] | None = None, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", EnvHelpFormatter)
        super().__init__(*args, **kwargs)
        self.environ = environ
        self._given: set[argparse.Action] = set()
        self.from_environment: dict[str, str] = {}
        """dest -> ``NAME=value`` for each value the last parse took from a variable."""

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        self._given = set()
        self.from_environment = {}
        parsed, extras = super().parse_known_args(args, namespace)
        try:
            self._read_environment(parsed)
        except argparse.ArgumentError as exc:
            self.error(str(exc))
        return parsed, extras

    def reject(self, message: str) -> NoReturn:
        """Exit 2 with ``message``, a problem found in the parsed values and phrased with their
        flags: each flag it names whose value came from a variable is named with that value."""
        by_flag = {o: a.dest for a in self._actions for o in a.option_strings}
        sources = [
            self.from_environment[dest]
            for dest in dict.fromkeys(by_flag.get(f, "") for f in _FLAG.findall(message))
            if dest in self.from_environment
        ]
        self.error(": ".join([", ".join(sources), message]) if sources else message)

    # --- argparse hooks ---------------------------------------------------------------------

    def _get_values(self, action: argparse.Action, arg_strings: list[str]) -> Any:
        self._given.add(action)  # argparse converts what the command line gives each option here
        return super()._get_values(action, arg_strings)

    def _get_value(self, action: argparse.Action, arg_string: str) -> Any:
        if not action.option_strings:
            return super()._get_value(action, arg_string)
        return _convert(action, arg_string, f"{long_option(action)} {arg_string}")

    # --- variables ----------------------------------------------------------------------------

    def _read_environment(self, namespace: argparse.Namespace) -> None:
        environ = os.environ if self.environ is None else self.environ
        given_dests = {action.dest for action in self._given}
        partners: dict[argparse.Action, list[argparse.Action]] = {}
        for group in self._mutually_exclusive_groups:
            for action in group._group_actions:
                partners[action] = [a for a in group._group_actions if a is not action]
        set_by: dict[argparse.Action, str] = {}
        for action in self._actions:
            name = env_name(action) if _settable(action) else ""
            raw = environ.get(name) if name else None
            if raw is None or action.dest in given_dests:
                continue
            others = partners.get(action, [])
            if any(other in self._given for other in others):
                continue  # e.g. --all-namespaces sets MODELROLL_NAMESPACE aside
            source = f"{name}={raw}"
            value = _from_variable(action, raw, source)
            if value != action.default:
                for other in others:
                    if other in set_by:
                        raise argparse.ArgumentError(
                            None, f"{source}: not allowed with {set_by[other]}"
                        )
                set_by[action] = source
            setattr(namespace, action.dest, value)
            self.from_environment[action.dest] = source


def _from_variable(action: argparse.Action, raw: str, source: str) -> Any:
    if action.nargs == 0:  # store_true, store_false, store_const, BooleanOptionalAction
        on = _convert(action, raw, source, boolean)
        if isinstance(action, argparse.BooleanOptionalAction):
            return on
        return action.const if on else action.default
    if _repeatable(action):
        return [_convert(action, item.strip(), source) for item in raw.split(",") if item.strip()]
    if action.nargs is not None:
        raise TypeError(f"{long_option(action)}: nargs={action.nargs!r} has no variable")
    return _convert(action, raw, source)


_TYPE_NAMES: dict[object, str] = {int: "integer", float: "number"}


def _convert(
    action: argparse.Action,
    text: str,
    source: str,
    convert: Callable[[str], Any] | None = None,
) -> Any:
    """``text`` converted by ``convert`` (default: the action's type) and checked against its
    choices; raises ArgumentError phrased ``<source>: <reason>``."""
    if convert is None:
        convert = action.type if callable(action.type) else str
    try:
        value = convert(text)
    except argparse.ArgumentTypeError as exc:
        raise argparse.ArgumentError(None, f"{source}: {exc}") from None
    except (TypeError, ValueError):
        kind = _TYPE_NAMES.get(convert) or getattr(convert, "__name__", "value").replace("_", " ")
        raise argparse.ArgumentError(None, f"{source}: invalid {kind}") from None
    choices: Iterable[Any] | None = action.choices
    if choices is not None and value not in choices:
        listed = ", ".join(str(choice) for choice in choices)
        raise argparse.ArgumentError(None, f"{source}: must be one of {listed}")
    return value
