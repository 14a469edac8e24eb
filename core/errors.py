"""The one exception type for expected failures."""


class UserError(Exception):
    """An expected failure caused by input or environment, not by a bug.

    The message says what is wrong and what to do. The CLI prints it on one line and exits
    non-zero without a traceback; every other exception is a bug and shows one.
    """
