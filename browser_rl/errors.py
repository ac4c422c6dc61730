"""The recipe's failure vocabulary, each error named for the boundary it crossed. A command (browser_rl.command_line)
exits with status 2 on a UsageError, which says what to change and where, and with status 1 once the environment is
unavailable; an EnvironmentFailure alone is retried, never scored."""


class UsageError(Exception):
    """What the user asked for cannot be run as given; the message says what to change."""


class ConfigError(UsageError):
    """A configuration the recipe cannot run, with a message that names the key and the file."""


class ModelUnavailable(UsageError):
    """A policy (a model, a checkpoint or an adapter) that could not be loaded, and why."""


class DemonstrationsError(UsageError):
    """A demonstrations file that cannot be used, with every bad row named by its line."""


class EnvironmentFailure(Exception):
    """The environment failed, not the policy: a server is gone, did not answer in time, or answered with an error.
    The batch's episodes are incomplete and must not be scored; `server` is the one that failed, if known."""

    def __init__(self, message: str, server: str | None = None):
        super().__init__(message)
        self.server = server


# Environment failures in a row a command rides out, each replaying the batch, before it stops (--max_env_failures).
MAX_ENV_FAILURES = 3


class EnvironmentUnavailable(Exception):
    """The environment failed max_env_failures times in a row: the run stops, its checkpoints kept."""
