"""Where kernels run: a real GPU, or the Triton interpreter on a CPU.

Triton decides at *decoration* time (`@triton.jit`) whether a kernel is compiled for a GPU or
run by its Python interpreter, by reading the environment variable ``TRITON_INTERPRET``. So the
variable has to be set before any module that defines a kernel is imported. Every stage package
imports this module first, which makes the rule hold for the whole project:

    no CUDA device  ->  TRITON_INTERPRET=1 (unless the user already set it)

The interpreter runs each program of the grid as NumPy code on the CPU, with CPU tensors.
It is slow but exact enough to test kernels on a laptop. One known blind spot (triton 3.9):
``tl.dot`` on bfloat16 operands returns garbage under the interpreter; float32 and float16 are
exact. Kernels therefore upcast to float32 before ``tl.dot`` when ``INTERPRET`` is true.
"""
from __future__ import annotations

import os

import torch

CUDA = torch.cuda.is_available()
if not CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

# CPU threads. The CPU runs here are the tiny models: small matmuls, and the interpreter's NumPy
# work in between. torch's OpenMP threads then buy nothing on an idle machine and cost a lot on a
# busy one (threads spin waiting for cores another process holds). Measured on a 2-core VM: idle,
# l5_smoke --impl torch 4.4 s with torch's default threads and 3.8 s with one; beside another
# torch process, 6.7 s and 3.7 s (l7_smoke: 37 s and 24 s). So one thread, unless the user set
# OMP_NUM_THREADS (the variable torch itself reads): then torch's choice stands.
CPU_THREADS = None if CUDA or os.environ.get("OMP_NUM_THREADS") else 1
if CPU_THREADS:
    torch.set_num_threads(CPU_THREADS)

#: True when Triton kernels run through the CPU interpreter rather than a GPU compiler.
INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
if INTERPRET:
    from .interpreter_patch import install          # helpers inside kernels stop re-patching tl (4x cheaper calls)
    install()


def default_device() -> str:
    """``cuda`` when a GPU is present, else ``cpu``."""
    return "cuda" if CUDA else "cpu"


def default_dtype(device: str) -> torch.dtype:
    """bfloat16 on a GPU (what real checkpoints ship in), float32 on a CPU (exact, and fast enough)."""
    return torch.bfloat16 if str(device).startswith("cuda") else torch.float32
