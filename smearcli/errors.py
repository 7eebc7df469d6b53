"""The error a user can act on: bad input or usage, raised by every layer with a message that names
the problem and what to do about it (never a command-line flag: the CLI adds those). The CLI turns
it into one line on stderr and exit status 2 (`smearcli.cli.errors`)."""


class UserError(Exception):
    """Bad input or usage: the message names the problem and what to do about it."""
