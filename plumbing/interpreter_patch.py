"""Two speed-ups of the Triton interpreter, for the CPU runs (tests, lessons, smoke scripts).
The second, ``skip_overflow_checks``, is at the end of this file; the first:

Under ``TRITON_INTERPRET=1`` a kernel launch first *patches* ``triton.language`` (every builtin
such as ``tl.load`` is swapped for its NumPy version; the originals come back when the launch
ends). Triton 3.9's interpreter does the same again at every call of a ``@triton.jit`` helper
inside the kernel (``_fp8_tiles``, ``_load_codes``, ...), although the launch has already patched
the same modules: an ``inspect.getmembers`` over ``tl``, ``tl.tensor`` and ``tl.math`` each time,
~1.5 ms. A helper called once per key tile pays that per tile: in ``l7_smoke.py`` the 508 launches
called helpers 11,720 times, a quarter of the run's time.

``install()`` makes that patching a no-op once the modules a helper sees have been patched in
the same launch (by the launch itself or by an earlier helper: Triton's ``tl.sum`` and friends
see ``tl.core`` as well), and changes nothing else: the first helper to see a module still
patches it, a helper called outside a launch is left to Triton, and a Triton whose interpreter
lacks the functions named here keeps its own behaviour. A launch is known by wrapping
``GridExecutor.__call__`` (a depth count, reset in ``finally``). The results are the same bits:
the functions called are the ones already installed. (Triton 3.6 on the GPU machines never runs
this: the interpreter is for machines without CUDA.)
"""
from __future__ import annotations

import dataclasses
import inspect


def install() -> bool:
    """Returns True if the interpreter was patched (False: an interpreter this does not know)."""
    try:
        import triton.language as tl
        from triton.runtime import interpreter as interp
        original, Scope, Grid = interp._patch_lang, interp._LangPatchScope, interp.GridExecutor
        launch = Grid.__call__
    except (ImportError, AttributeError):
        return False
    if getattr(original, "_tll_skips_repatching", False):
        return True
    state = {"depth": 0, "patched": set()}       # launches running; the modules patched since the first began

    def langs(fn) -> set:
        return {id(v) for v in fn.__globals__.values() if inspect.ismodule(v) and v in (tl, tl.core)}

    def patch_lang(fn):
        mine = langs(fn)
        if state["depth"] and mine and mine <= state["patched"]:
            return Scope()                        # patched already in this launch: nothing to do or undo
        scope = original(fn)                      # (no tl in sight: Triton's own error, raised here)
        if state["depth"]:
            state["patched"] |= mine
        return scope

    def counted_launch(self, *args, **kwargs):
        state["depth"] += 1
        try:
            return launch(self, *args, **kwargs)  # patches tl first, restores it last (Triton's finally)
        finally:
            state["depth"] -= 1
            if not state["depth"]:
                state["patched"] = set()

    patch_lang._tll_skips_repatching, patch_lang._tll_original = True, original
    interp._patch_lang = patch_lang
    Grid.__call__ = counted_launch
    skip_overflow_checks(interp)
    return True


def skip_overflow_checks(interp) -> bool:
    """Triton's int32 overflow check on every integer add, sub and mul (an int64 copy, two compares,
    a ``device_assert``) asserts only in debug mode, and the interpreter still built the check for
    every op: a quarter of a CPU chain row's time, spent on an assert that was then dropped. Build
    it only when the interpreter's ``debug`` option is on, as a compiled kernel keeps it only in
    debug mode. Returns whether the checks are on."""
    builder = getattr(interp, "interpreter_builder", None)
    options = getattr(builder, "options", None)
    if options is None or not hasattr(options, "sanitize_overflow") or not hasattr(options, "debug"):
        return True                               # an interpreter this does not know: its own default
    builder.options = dataclasses.replace(options, sanitize_overflow=bool(options.debug))   # frozen dataclass
    return builder.options.sanitize_overflow
