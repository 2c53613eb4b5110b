"""Programmatic dependent launch (PDL, Hopper and later): a kernel may start before the one
before it in the stream has finished, and waits for it only where it must (lessons/l7_fast/9_pdl.md).

Two instructions (Triton: ``tl.extra.cuda``), and one launch option (``launch_pdl=True``):

    gdc_launch_dependents()   "the next kernel may launch now"; it launches once every program of
                              this kernel has said so or exited (without it: only after all exit)
    gdc_wait()                wait until the kernel before has finished and its writes are
                              visible (a no-op after the first call, and without PDL)

    kernel A (PDL)   [trigger | ...... A's work ...... ]
    kernel B (PDL)             [B's weight loads | wait ....... | B's work ]
                                                  ^ A done: B reads A's output, writes its own

The rule that keeps it correct: before its ``gdc_wait`` a kernel reads only what no kernel of the
step writes (a GEMV's weights) and writes nothing. Then, by induction, once a kernel's wait
returns every earlier kernel has finished, as in plain stream order. A kernel launched without
PDL (cuBLAS, torch ops, any kernel not written for it) waits for the whole previous kernel as always.
"""
from __future__ import annotations

import functools

import torch

from plumbing.runtime import INTERPRET  # (import before triton: picks GPU or interpreter)
from plumbing.errors import UserError

import triton
import triton.language as tl
from triton.language.extra import cuda as tl_cuda


@functools.lru_cache(maxsize=None)      # asked at every launch (check_pdl): once per device
def pdl_supported(device: torch.device) -> bool:
    """Hopper (sm_90) or newer, compiled: the interpreter runs no grid, so it has nothing to overlap."""
    return not INTERPRET and device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 9


def check_pdl(pdl: bool, device: torch.device) -> None:
    if pdl and not pdl_supported(device):
        raise UserError(f"pdl needs a Hopper (sm_90) or newer GPU and compiled kernels; here: {device}"
                        + (" under the Triton interpreter" if INTERPRET else "") + ". Pass pdl=False.")


@triton.jit
def let_next_start(PDL: tl.constexpr):
    """The next kernel (if launched with PDL) may start now; it waits for this one where it must."""
    if PDL:
        tl_cuda.gdc_launch_dependents()


@triton.jit
def wait_for_previous(PDL: tl.constexpr):
    """Everything the previous kernels wrote is visible from here on."""
    if PDL:
        tl_cuda.gdc_wait()
