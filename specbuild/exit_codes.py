"""The exit statuses of every ``specbuild`` command, one per kind of outcome, so a script can tell
them apart (``docs/cli.md`` lists them):

====  ==========================  ==============================================================
code  name                        when
====  ==========================  ==============================================================
0     OK                          the command did what it was asked
1     FAILED                      anything else went wrong (a build step, a server that died);
                                  ``verify --sampling``: NOT EXERCISED, no draft token was proposed,
                                  so the test compared plain sampling with itself (greedy verify
                                  with no drafts still exits 0, LOSSLESS with a warning: the
                                  equality it checks holds)
2     BAD_INPUT                   a usage error or bad input: an option, a recipe, a prompts file
3     SERVER_UNAVAILABLE          the server is unreachable, not ready in time, or did not start
4     NOT_LOSSLESS                a lossless check failed (speculative output != plain output);
                                  ``check-draft``: a check of the draft failed
5     CROSS_CHECK_FAILED          a benchmark cross-check failed (counters or outputs disagree)
130   INTERRUPTED                 Ctrl-C / SIGTERM
====  ==========================  ==============================================================

``2`` is also what click uses for its own usage errors, so a bad option and a bad recipe read alike.

Raise :class:`CommandError` (a :class:`click.ClickException`) with one of these codes; click prints
``Error: <message>`` and exits with the code.
"""

from __future__ import annotations

from enum import IntEnum

import click


class ExitCode(IntEnum):
    """Exit statuses; see the module docstring."""

    OK = 0
    FAILED = 1
    BAD_INPUT = 2
    SERVER_UNAVAILABLE = 3
    NOT_LOSSLESS = 4
    CROSS_CHECK_FAILED = 5
    INTERRUPTED = 130


class CommandError(click.ClickException):
    """A failure shown as ``Error: <message>`` without a traceback, exiting with ``code``.

    Example: ``raise CommandError("server 127.0.0.1:8001 is not ready", ExitCode.SERVER_UNAVAILABLE)``.
    """

    def __init__(self, message: str, code: ExitCode = ExitCode.FAILED) -> None:
        super().__init__(message)
        self.exit_code = int(code)


def bad_input(message: str) -> CommandError:
    """A :class:`CommandError` with :attr:`ExitCode.BAD_INPUT` (a recipe, option or file the user must fix)."""
    return CommandError(message, ExitCode.BAD_INPUT)
