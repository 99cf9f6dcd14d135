"""One exception type for mistakes a user can fix; the CLI prints its message on one line."""


class UserError(Exception):
    """A bad path, shape, parameter or checkpoint: the message says what to change."""


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (its type name when the message is empty)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
