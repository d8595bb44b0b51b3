"""The errors a user meets, and the exit codes the CLI gives them.

A `UserError` is bad input or a refusal that the user can fix: a malformed
config, a corrupt model file, a key that is not ours. The CLI prints its
message, without a traceback, and exits with its `exit_code`. Every other
exception is a bug and keeps its traceback. This module imports nothing, so
any module may raise these errors.
"""

from __future__ import annotations

EXIT_USAGE = 2  # bad input: a config, a file, an argument
EXIT_REFUSED = 3  # a worker the orchestrator ejected, banned or turned away


class UserError(Exception):
    """An error the user can act on; the message names the problem."""

    exit_code = EXIT_USAGE


class ConfigError(UserError, ValueError):
    """A configuration problem, with a message that names the key."""


class LaunchError(UserError, RuntimeError):
    """A local swarm that cannot start as asked (launch/)."""
