"""harness/gpu_compile.py: every kernel compiles for a Hopper GPU (sm_90) on a machine without one.
Each run is a process of its own with TRITON_INTERPRET=0 (a kernel is made interpreted or compiled
when its module is imported, and this test process imported them interpreted)."""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _run(args, tmp_path=None):
    env = dict(os.environ, TRITON_INTERPRET="0", PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), str(tmp_path or "")])))
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.deep                     # a process of its own that imports torch and compiles: seconds
def test_a_kernel_that_only_a_gpu_compiler_refuses_is_reported(tmp_path):
    """The interpreter runs this kernel happily; triton's compiler refuses the plain global it reads."""
    (tmp_path / "planted_kernel.py").write_text(textwrap.dedent('''
        import torch, triton, triton.language as tl
        WIDTH = 128                                   # a plain int: only tl.constexpr globals may be read

        @triton.jit
        def twice(x_ptr, y_ptr):
            i = tl.arange(0, WIDTH)
            tl.store(y_ptr + i, tl.load(x_ptr + i) * 2)

        def launch():
            x = torch.empty(128, dtype=torch.bfloat16)
            twice[(1,)](x, torch.empty_like(x))
    '''))
    script = ("from harness.gpu_compile import compile_launches, report\n"
              "import planted_kernel\n"
              "r = compile_launches(planted_kernel.launch)\n"
              "print(report(r, 90))\n")
    p = _run(["-c", script], tmp_path)
    assert p.returncode == 0, p.stderr
    assert "1 launch(es) of 1 kernel(s) in 1 variant(s) compiled for sm_90, 1 failed" in p.stdout, p.stdout + p.stderr
    assert "Cannot access global variable WIDTH" in p.stdout, p.stdout


def test_the_kernels_to_cover_are_the_launched_ones_not_the_helpers(tmp_path):
    from harness.gpu_compile import launched_kernels
    (tmp_path / "l99_demo").mkdir()
    (tmp_path / "l99_demo" / "ops.py").write_text(textwrap.dedent('''
        @triton.jit
        def _helper(x):
            return x

        @triton.jit(do_not_specialize=["n"])
        def _twice_kernel(x_ptr, n):
            pass

        @triton.jit
        def _never_launched(x_ptr):
            pass

        def twice(x):
            _twice_kernel[(1,)](x, x.numel())
    '''))
    assert launched_kernels(str(tmp_path)) == {"_twice_kernel"}
    assert {"_chunked_matmul_kernel", "_paged_attn_kernel", "_peer_all_reduce"} <= launched_kernels(str(ROOT))


@pytest.mark.deep
def test_every_launched_kernel_of_every_stage_compiles_for_sm_90():
    """The workloads of harness/gpu_compile_work.py (stage 13's variants, stage 12's all-reduce, the
    latest engine under each option on a two-layer Qwen3-0.6B shape and the windowed tiny model)
    launch every kernel some line of a stage launches, and each compiles."""
    from harness.gpu_compile import launched_kernels
    p = _run(["-m", "harness.gpu_compile"])
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    last = [ln for ln in p.stdout.splitlines() if "launch(es) of" in ln]
    assert last and last[0].endswith(", 0 failed"), p.stdout
    assert f" of {len(launched_kernels(str(ROOT)))} kernel(s) " in last[0], p.stdout
