"""The one error type the CLI turns into a single line on stderr (exit status 2)."""


class UserError(Exception):
    """Bad input or usage: the message names the problem and what to do about it."""
