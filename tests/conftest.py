"""Test set-up: tiny checkpoints in a private cache, scripts/ importable, GPU tests skipped on CPU."""
import os
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

# Stage 5's scheduler fuzz (tests/test_l5_fuzz.py): 150 derandomized examples per test in CI,
# the same on every machine; `--hypothesis-profile=l5-deep` for 2000 random ones.
settings.register_profile("l5-ci", max_examples=150, derandomize=True, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("l5-deep", max_examples=2000, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("l5-ci")

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT))


def pytest_configure(config):
    # Keep the user's cache untouched; every run regenerates the tiny checkpoints (milliseconds).
    if "TRITON_LLM_LESSONS_CACHE" not in os.environ:
        import tempfile
        os.environ["TRITON_LLM_LESSONS_CACHE"] = tempfile.mkdtemp(prefix="tll-cache-")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # no test may reach the network
    import l1_dense  # noqa: F401  (sets TRITON_INTERPRET before any kernel module is imported)


def pytest_collection_modifyitems(config, items):
    import torch
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (run the GPU sweep on a GPU machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def tiny():
    """family -> loaded (model, path) in float32 on the default device (cuda if present, else
    cpu), loaded once per session. On a GPU the Triton kernels compile for real; on a CPU they
    run through the interpreter."""
    import torch
    from l1_dense.checkpoint import load_model
    from l1_dense.runtime import default_device
    from l1_dense.tiny import tiny_checkpoint
    cache = {}

    def get(family="qwen3"):
        if family not in cache:
            path = tiny_checkpoint(family)
            cache[family] = (load_model(path, default_device(), torch.float32), path)
        return cache[family]
    return get


def pytest_terminal_summary(terminalreporter):
    """The scheduler fuzzes' figures (stage 5 and stage 6): workloads run and invariants checked."""
    for module, title in (("l5_fake", "l5 scheduler fuzz"), ("l6_fake", "l6 prefix-cache fuzz")):
        fake = sys.modules.get(module)
        if fake is None or not fake.EXAMPLES["workloads"]:
            continue
        tr = terminalreporter
        tr.write_sep("-", title)
        more = ", ".join(f"{n} {k}" for k, n in fake.EXAMPLES.items() if k not in ("workloads", "steps"))
        tr.write_line(f"{fake.EXAMPLES['workloads']} workloads, {fake.EXAMPLES['steps']} scheduler steps"
                      f"{', ' + more if more else ''}, {sum(fake.CHECKS.values())} invariant checks:")
        for name, n in sorted(fake.CHECKS.items()):
            tr.write_line(f"  {n:>9}  {name}")


@pytest.fixture(scope="session")
def chain_run():
    """(exit code, printed output) of ``check_chain.py --model tiny-<family> --dtype <dtype>``, run
    once per session: test_chain.py and the README's chain-table test read the same tiny-Qwen3
    run (about a minute of interpreter time on a CPU)."""
    import contextlib
    import io
    cache = {}

    def get(family="qwen3", dtype="float32"):
        if (family, dtype) not in cache:
            from check_chain import main
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                rc = main(["--model", f"tiny-{family}", "--dtype", dtype])
            cache[family, dtype] = (rc, out.getvalue())
        return cache[family, dtype]
    return get
