"""The error a user can act on: bad input or usage, raised by every layer with a message that names
the problem and what to do about it (never a command-line flag: the CLI adds those). The CLI turns
it into one line on stderr and exit status 2 (`smearcli.cli.errors`); `UserCodeError`, a failure
of the user's own code under audit, into exit status 1."""


class UserError(Exception):
    """Bad input or usage: the message names the problem and what to do about it."""


class UserCodeError(UserError):
    """The user's own code (the checkout they asked smearcli to audit) failed: an exception in it,
    a `sys.exit()`, a time limit. Their code, not their input: the CLI exits with status 1."""

    status = 1
    timed_out = False


class CannotRun(UserError, ValueError):
    """A schedule asked of a runner that lacks a capability it needs (a cache it can neither crop
    nor copy, no padded batches): the message names what is missing. Still a ValueError, which the
    library raised here before."""
