"""The one exception type for expected failures, and its kind that names the run's settings."""

from __future__ import annotations

import errno
import string
from collections.abc import Mapping
from typing import Any


class UserError(Exception):
    """An expected failure caused by input or environment, not by a bug.

    The message says what is wrong and what to do. The CLI prints it on one line and exits
    non-zero without a traceback; every other exception is a bug and shows one.
    """


def no_room(exc: BaseException) -> bool:
    """Whether ``exc`` is a file system out of room (ENOSPC, EDQUOT): the environment, which
    a command says in one line, not a bug."""
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)


class SettingError(UserError):
    """A UserError about a run's settings, naming each by its setting name in braces
    (``"{rank_containers} needs {accelerators} 2 or more"``), whoever gave it: ``str()`` writes
    the names as an experiment or study file spells them (``rank_containers``), and
    :meth:`render` as the caller does (the CLI: its flags, ``--rank-containers``). The values
    the message quotes go in ``values`` (``"{nodes} must be 1 or more, got {got}"``,
    ``got=0``), so that braces in them are never taken for a setting."""

    def __init__(self, template: str, **values: Any) -> None:
        self.template = template
        self.values = values
        super().__init__(self.render({}))

    @property
    def settings(self) -> list[str]:
        """The settings the message names, in order."""
        fields = (field for _, field, _, _ in string.Formatter().parse(self.template) if field)
        return [field for field in fields if field not in self.values]

    def render(self, names: Mapping[str, str]) -> str:
        """The message with each setting written as ``names`` maps it (else its own name)."""
        spelled = {name: names.get(name, name) for name in self.settings}
        return self.template.format(**spelled, **self.values)
