"""Compile Triton kernels for a GPU on a machine that has none: what a CPU's interpreter never sees.

    python -m harness.gpu_compile                 # every launched kernel, for sm_90 (H100/H200), ~1 minute
    python -m harness.gpu_compile --arch 80       # another compute capability (PDL variants need 90)

The interpreter runs a kernel's Python, not the compiler: a kernel that reads a module's plain
global (only ``tl.constexpr`` globals may be read), a shape the compiler's layouts refuse, or a
tile whose shared memory exceeds the GPU's only fails on a GPU. Here triton's own compiler
(TTIR -> TTGIR -> LLVM -> PTX -> cubin with its bundled ptxas) runs on the CPU: the host code is run
as on a GPU (TRITON_INTERPRET=0, bf16 tensors on the CPU), and each launch is compiled for the
target instead of launched (triton's warm-up path, with a stand-in driver that names the target).
No kernel runs: the outputs are never read. What it cannot see: a wrong result, a race, the speed.

Workloads (``WORKLOADS``) call the host functions with the launch variants the host picks on an
H100 (132 SMs) and the ones tests force. The process must start with TRITON_INTERPRET=0, before any
kernel module is imported: ``main`` sets it, and tests run this module in a subprocess.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass
from typing import Callable

SMEM_LIMIT = {80: 163 * 1024, 86: 99 * 1024, 89: 99 * 1024, 90: 227 * 1024}   # bytes a block may use


@dataclass
class Compiled:
    kernel: str
    constexprs: str
    seconds: float
    shared: int | None = None
    error: str | None = None


def compile_only_process(prog: str) -> None:
    """This process's kernels are to be compiled, not interpreted: triton decides when a kernel's
    module is imported, so before any is (else exit, saying how to run ``prog``)."""
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0") or "triton" in sys.modules:
        sys.exit(f"{prog} compiles kernels for a GPU instead of interpreting them: run it as a process of its "
                 "own, without TRITON_INTERPRET=1 (kernels are made interpreted or compiled when their module is "
                 "imported)")
    os.environ["TRITON_INTERPRET"] = "0"


def use_target(arch: int):
    """A stand-in driver: the target is the GPU named, and no device is touched."""
    import torch
    from triton.backends.compiler import GPUTarget
    from triton.backends.driver import DriverBase
    from triton.runtime.driver import driver

    class CompileOnly(DriverBase):
        @classmethod
        def is_active(cls):
            return True

        def map_python_to_cpp_type(self, ty):
            return ty

        def get_current_target(self):
            return GPUTarget("cuda", arch, 32)

        def get_active_torch_device(self):
            return torch.device("cpu")

        def get_benchmarker(self):
            raise NotImplementedError("compile only")

        def get_current_device(self):
            return 0

        def get_current_stream(self, device=None):
            return 0

    driver.set_active(CompileOnly())


def compile_launches(work: Callable[[], None], arch: int = 90) -> list[Compiled]:
    """Run ``work`` with every kernel launch compiled for sm_<arch> instead (one record a launch)."""
    from triton.runtime.jit import JITFunction
    use_target(arch)
    out, real = [], JITFunction.run

    def compile_instead(self, *args, grid, warmup, **kw):
        t = time.perf_counter()
        names = [p.name for p in self.params]
        const = ", ".join(f"{n}={a}" for n, a, p in zip(names, args, self.params) if p.is_constexpr)
        const = ", ".join(filter(None, [const] + [f"{k}={v}" for k, v in kw.items()
                                                  if k in names or k in ("num_warps", "num_stages")]))
        try:
            k = real(self, *args, grid=grid, warmup=True, **kw)
            if "cubin" not in k.asm:
                raise RuntimeError(f"no cubin was made (stages: {list(k.asm)})")
            shared = getattr(k.metadata, "shared", None)
            if shared is not None and shared > SMEM_LIMIT.get(arch, SMEM_LIMIT[90]):
                raise RuntimeError(f"{shared} bytes of shared memory, more than sm_{arch}'s "
                                   f"{SMEM_LIMIT.get(arch, SMEM_LIMIT[90])}")
            out.append(Compiled(self.__name__, const, time.perf_counter() - t, shared))
        except Exception as e:                          # noqa: BLE001  every failure is the report's
            msg = f"{type(e).__name__}: {e}"
            cause = e.__cause__ or e.__context__
            if cause is not None:
                msg += f" <- {type(cause).__name__}: {cause}"
            out.append(Compiled(self.__name__, const, time.perf_counter() - t, error=" ".join(msg.split())[:600]))
        return None

    JITFunction.run = compile_instead
    try:
        work()
    finally:
        JITFunction.run = real
    return out


def launched_kernels(root: str) -> set[str]:
    """Every @triton.jit function of the stage packages (l<N>_*/) that some line launches (``name[``):
    what the workloads must cover. Helpers called from inside kernels are never launched."""
    import glob
    import re
    jit, text = re.compile(r"@triton\.jit[^\n]*\n(?:@[^\n]*\n)*def (\w+)"), []
    for path in glob.glob(os.path.join(root, "l[0-9]*_*", "*.py")):
        with open(path) as f:
            text.append(f.read())
    src = "\n".join(text)
    return {name for name in jit.findall(src) if re.search(rf"\b{name}\[", src)}


def report(results: list[Compiled], arch: int) -> str:
    """A line per variant (kernel and constexprs: one compile, however many launches), then the count."""
    variants: dict = {}
    for r in results:
        v = variants.setdefault((r.kernel, r.constexprs, r.error), [r, 0])
        v[1] += 1
    lines = [f"{'kernel':28s} {'launches':>8s} {'smem KB':>7s}  constexprs / error"]
    for r, n in variants.values():
        smem = "-" if r.shared is None else f"{r.shared / 1024:.0f}"
        lines.append(f"{r.kernel:28s} {n:8d} {smem:>7s}  " + (f"FAILED {r.error}" if r.error else r.constexprs))
    bad = sum(r.error is not None for r in results)
    kernels = len({r.kernel for r in results})
    lines.append(f"{len(results)} launch(es) of {kernels} kernel(s) in {len(variants)} variant(s) compiled for "
                 f"sm_{arch}, {bad} failed")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", type=int, default=90, help="compute capability x 10 (90: H100/H200)")
    ap.add_argument("--only", default=None, help="comma-separated workloads (default: all of gpu_compile_work's)")
    a = ap.parse_args(argv)
    compile_only_process("python -m harness.gpu_compile")
    from harness.gpu_compile_work import WORKLOADS
    names = a.only.split(",") if a.only else list(WORKLOADS)
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown:
        sys.exit(f"--only: unknown workload(s) {unknown}; these exist: {', '.join(WORKLOADS)}")
    t0, results = time.perf_counter(), []
    for n in names:
        print(f"gpu_compile: {n} ...", file=sys.stderr, flush=True)
        results += compile_launches(WORKLOADS[n], a.arch)
    print(report(results, a.arch))
    missing = set() if a.only else launched_kernels(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) \
        - {r.kernel for r in results}
    if missing:
        print(f"kernels no workload launched (add one to harness/gpu_compile_work.py): {', '.join(sorted(missing))}")
    print(f"({time.perf_counter() - t0:.0f} s)")
    return 1 if not results or missing or any(r.error for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
