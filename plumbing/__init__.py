"""What every stage shares and no lesson is about: where kernels run (``runtime``: the GPU or the
Triton interpreter), user-facing errors, the exercise hooks, the smoke-script interface, the
built-in tiny checkpoints, and matplotlib for the scripts that draw a figure (``plot``).

Importing this package loads nothing heavy: a script can check its flags before torch loads.
Stage packages import ``plumbing.runtime`` first, which must run before any Triton kernel is
defined."""
