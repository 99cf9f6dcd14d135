"""One exception type for mistakes a user can fix; the CLI prints its message on one line. And one
for a run stopped by SIGTERM (the command line exits 143 after its one line)."""


class UserError(Exception):
    """A bad path, shape, parameter or checkpoint: the message says what to change. Settings are
    named as `setting` (the keyword the engine takes); the command line shows them as its flags."""


class Terminated(Exception):
    """SIGTERM (what a scheduler sends before it kills) stopped a run at once: the images in flight
    were dropped, every finished row is on disk, and the same command resumes the run."""


def first_line(exc: BaseException, limit: int = 200) -> str:
    """The first line of an exception's message (its type name when empty), for one-line errors."""
    text = str(exc).strip().splitlines()
    return text[0][:limit] if text else type(exc).__name__


def check_alpha(alpha: float) -> None:
    """UserError unless 0 < alpha < 1 (the failure probability of CERTIFY and PREDICT); NaN is not."""
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 < alpha < 1:
        raise UserError(f"alpha must be in (0, 1), got {alpha}")
