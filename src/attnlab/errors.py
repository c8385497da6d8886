"""The one exception type for mistakes a user can fix.

A `UserError` names the thing that was wrong and how to fix it. The CLI prints it as one line and
exits with code 2. Bugs are not user errors: they raise ordinary exceptions with tracebacks.
"""


class UserError(Exception):
    """Bad input from the user: a config key, a file, a prompt, a flag."""


class ConfigError(UserError):
    """An unknown, missing or badly typed configuration value."""


class CheckpointError(UserError):
    """A run folder that is missing, incomplete, corrupt or incompatible."""


class ExportError(UserError, ValueError):
    """A model with a part that the export target has no counterpart for. Also a `ValueError`:
    asking a library function to convert such a model is a bad argument too."""
