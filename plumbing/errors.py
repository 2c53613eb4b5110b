"""User-facing errors.

Bad input must fail early with a message that names the problem *and* the fix, never with a
traceback from deep inside torch. Every check in the project raises :class:`UserError` (or a
subclass); the smoke scripts print its message and exit with status 2.
"""


class UserError(ValueError):
    """A problem with what the user asked for (a path, a prompt, a flag), not a bug."""


class WindowsUnsupported(UserError):
    """A checkpoint with sliding windows given to a stage whose KV cache attends to every key
    (stages 1-7, and stage 13's invariant attention). ``check_chain.py`` lists it as that stage's
    refusal, and nothing else."""
