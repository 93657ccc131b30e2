"""The errors a person causes. The CLI prints them as one or two lines and exits with status 2 (a ``StartFailure``,
what this machine could not start: 1); anything else is the program's fault and keeps its traceback."""


class UserError(Exception):
    """A bad plan, an unknown model, a job larger than any GPU: what is wrong, where, and what is allowed."""

    exit_status = 2


class StartFailure(UserError):
    """What this machine could not start for a run before anything ran (a local Ray): said in one line as a
    ``UserError`` is, but it is not the person's mistake: exit 1, and the run folder says ``crashed``, with the line
    as its ``reason``."""

    exit_status = 1
