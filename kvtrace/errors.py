"""Errors shared by every layer.  Lives at the bottom of the package so that command modules
(``kvtrace.<pkg>.cli``) never import the top-level ``kvtrace.cli`` dispatcher."""


class CLIError(Exception):
    """A user-facing error: printed as one line, exit status 2, no traceback."""
