"""The errors a person causes. The CLI prints them as one or two lines and exits with status 2; anything else is the
program's fault and keeps its traceback."""


class UserError(Exception):
    """A bad plan, an unknown model, a job larger than any GPU: what is wrong, where, and what is allowed."""

    exit_status = 2
