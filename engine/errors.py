"""One exception type for mistakes a user can fix; the CLI prints its message on one line."""


class UserError(Exception):
    """A bad path, shape, parameter or checkpoint: the message says what to change."""
