"""plumbing/interpreter_patch.py: under the Triton interpreter, a @triton.jit helper called inside
a kernel no longer re-patches triton.language once the launch has patched it, and the kernel's
result is unchanged."""
import pytest
import torch

from plumbing.runtime import INTERPRET

import triton
import triton.language as tl

pytestmark = pytest.mark.skipif(not INTERPRET, reason="the Triton interpreter only (CPU)")


@triton.jit
def _scaled(x, j):
    return x * (j + 1) + tl.sum(x, 0) * 0           # tl.sum: a Triton helper that sees tl.core too


@triton.jit
def _loop_kernel(x_ptr, out_ptr, STEPS: tl.constexpr, N: tl.constexpr):
    i = tl.arange(0, N)
    x = tl.load(x_ptr + i)
    acc = tl.zeros([N], tl.float32)
    for j in range(STEPS):
        acc += _scaled(x, j)
    tl.store(out_ptr + i, acc)


def run(monkeypatch, patched: bool) -> tuple[torch.Tensor, int]:
    """The kernel's output, and how many times Triton's own _patch_lang ran."""
    from triton.runtime import interpreter as interp
    from plumbing import interpreter_patch
    real = getattr(interp._patch_lang, "_tll_original", interp._patch_lang)
    calls = []

    def counting(fn):
        calls.append(fn)
        return real(fn)
    monkeypatch.setattr(interp, "_patch_lang", counting)
    monkeypatch.setattr(interp.GridExecutor, "__call__", interp.GridExecutor.__call__)   # undone after the test
    if patched:
        assert interpreter_patch.install()
    x = torch.arange(16, dtype=torch.float32)
    out = torch.empty_like(x)
    _loop_kernel[(1,)](x, out, STEPS=20, N=16)
    return out, len(calls)


def test_helpers_stop_repatching_and_results_are_unchanged(monkeypatch):
    out, n = run(monkeypatch, patched=True)
    assert torch.equal(out, torch.arange(16, dtype=torch.float32) * sum(range(1, 21)))
    assert n <= 3, f"Triton patched triton.language {n} times for one launch (expected: the launch, the first helper, tl.sum's first call)"


def test_without_the_patch_every_helper_call_repatches(monkeypatch):
    """The check above can fail: Triton's own behaviour, one patching per helper call."""
    out, n = run(monkeypatch, patched=False)
    assert torch.equal(out, torch.arange(16, dtype=torch.float32) * sum(range(1, 21)))
    assert n > 20, n


def test_a_helper_called_outside_a_kernel_leaves_no_state_behind(monkeypatch):
    """Called from Python (not inside a launch) a helper fails as in Triton, and the next launch
    is counted and patched as usual."""
    with pytest.raises(Exception):
        _scaled(torch.ones(2), 1)
    out, n = run(monkeypatch, patched=True)
    assert torch.equal(out, torch.arange(16, dtype=torch.float32) * sum(range(1, 21))) and 1 <= n <= 3



@triton.jit
def _add_kernel(out_ptr, a, b):
    tl.store(out_ptr, a + b)


@pytest.fixture
def builder_options():
    from triton.runtime import interpreter as interp
    saved = interp.interpreter_builder.options
    yield interp
    interp.interpreter_builder.options = saved


def test_int32_overflow_checks_are_built_only_when_they_can_assert(builder_options):
    """Triton asserts its int32 overflow checks only in debug mode; the interpreter built them for
    every integer op anyway (a quarter of a chain row's time). After the patch they are built only
    with debug on, and then 2**31 - 1 + 1 is still caught."""
    import dataclasses
    from plumbing.interpreter_patch import skip_overflow_checks
    out = torch.zeros(1, dtype=torch.int32)
    assert skip_overflow_checks(builder_options) is False
    _add_kernel[(1,)](out, 2**31 - 1, 1)
    assert out.item() == -2**31                       # wraps, as a compiled kernel without debug does
    b = builder_options.interpreter_builder
    b.options = dataclasses.replace(b.options, debug=True)
    assert skip_overflow_checks(builder_options) is True
    with pytest.raises(Exception, match="overflow"):
        _add_kernel[(1,)](out, 2**31 - 1, 1)
