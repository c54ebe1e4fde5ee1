"""The failures rlhfkit anticipates, in the two kinds the command line tells apart.

`UsageError`: what the user gave cannot work - a data file, a model path, a reward function
spec, a length the model cannot hold. `rlhfkit` prints the message and exits with 2, as it
does for a bad option or config value (`config.ConfigError`). `RunError`: an anticipated
failure once the run is under way, such as a reward function that raises or returns no usable
score; exit code 1. Each message says what failed, where (file and line, field or option,
sample), what is allowed and what to do, so that no traceback is needed to act on it.
"""


class UsageError(ValueError):
    """Input that cannot work; the message names it, where it is and what is allowed."""


class RunError(RuntimeError):
    """An anticipated failure during a run; the message names what failed and on what."""
