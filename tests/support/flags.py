"""Reading a command's --help as the tests that check flags and their docs do."""

from __future__ import annotations

import re


def help_entries(text: str) -> dict[str, str]:
    """Each ``--flag`` of a ``--help`` text -> its entry (invocation and help on one line).

    Render the help wide (COLUMNS=1000) so that no entry is wrapped mid-word.
    """
    entries: dict[str, str] = {}
    current: list[str] = []
    for line in [*text.splitlines(), ""]:
        if line.startswith("   ") and current:
            current.append(line.strip())
            continue
        if current:
            entry = " ".join(current)
            for option in re.findall(r"--[\w-]+", current[0].split("  ")[0]):
                entries[option] = entry
        current = [line.strip()] if line.startswith("  -") else []
    return entries
