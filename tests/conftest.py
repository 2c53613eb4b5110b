"""Test set-up: tiny checkpoints in a private cache, scripts/ importable, the tiers, GPU tests
deselected on a CPU.

Tiers (pyproject.toml's markers; the Makefile's targets):

    make test           everything not marked ``lessons`` or ``deep``: the unit and engine tests,
                        one all-invariants fuzz per stage at a modest example count, every planted
                        bug on its pinned (already shrunk) workload, the chain on tiny-qwen3
                        (stages 1-7, one test each)
    make test-lessons   ``lessons``: break-it / build-it exercises, the lessons' quoted outputs,
                        the chain on the other tiny checkpoints
    make test-deep      ``deep`` and ``fuzz``: the hypothesis searches that found each planted bug,
                        run from scratch, and every property test at the deep example count

Each tier runs through pytest-xdist (``-n auto --dist loadfile``, the Makefile): one process per
core, each taking whole test files, so a file's module fixtures are built once. Two files are shared
out test by test (SPLIT below): their tests build everything themselves and are long.
"""
import os
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

# Property tests (marked ``fuzz``): 150 derandomized examples each in the default tier, the same on
# every machine; ``--hypothesis-profile=deep`` (make test-deep) for 1000 random ones.
settings.register_profile("ci", max_examples=150, derandomize=True, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("deep", max_examples=1000, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("ci")

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT))


def pytest_configure(config):
    # Keep the user's cache untouched; every run regenerates the tiny checkpoints (milliseconds) in a
    # folder of its own, made by the process pytest was started as (xdist's workers inherit the
    # variable, so they never make one) and removed by that process when the session ends: finished,
    # failed or interrupted (pytest_unconfigure).
    if "TRITON_LLM_LESSONS_CACHE" not in os.environ:
        import tempfile
        config._tll_cache = os.environ["TRITON_LLM_LESSONS_CACHE"] = tempfile.mkdtemp(prefix="tll-cache-")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # no test may reach the network
    import plumbing.runtime  # noqa: F401  (sets TRITON_INTERPRET before any kernel module is imported)
    if os.environ.get("PYTEST_XDIST_WORKER") and "OMP_NUM_THREADS" not in os.environ:
        # one xdist worker per core: one torch thread each (and in the scripts a test starts)
        os.environ["OMP_NUM_THREADS"] = "1"
        import torch
        torch.set_num_threads(1)


def pytest_unconfigure(config):
    made = getattr(config, "_tll_cache", None)
    if made and not os.environ.get("PYTEST_XDIST_WORKER"):
        import shutil
        shutil.rmtree(made, ignore_errors=True)
        if os.environ.get("TRITON_LLM_LESSONS_CACHE") == made:
            del os.environ["TRITON_LLM_LESSONS_CACHE"]


#: files whose tests xdist's loadfile shares out one by one (test_chain.py: a stage's chain per
#: test, up to a minute of interpreter each; test_matrix.py: one combination of features per test)
SPLIT = ("tests/test_chain.py", "tests/test_matrix.py")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadfile``, except that each test of a SPLIT file is a unit of its own."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class SplitSome(LoadFileScheduling):
        def _split_scope(self, nodeid):
            return nodeid if nodeid.split("::")[0] in SPLIT else super()._split_scope(nodeid)
    return SplitSome(config, log)


@pytest.hookimpl(trylast=True)          # after -m and -k have deselected
def pytest_collection_modifyitems(config, items):
    """Without a CUDA device the GPU tests are deselected (one line in the summary, not a skip each)."""
    import torch
    if not torch.cuda.is_available():
        gpu = [item for item in items if "gpu" in item.keywords]
        if gpu:
            config.hook.pytest_deselected(items=gpu)
            items[:] = [item for item in items if "gpu" not in item.keywords]
            config._gpu_deselected = len(gpu)


def pytest_report_header(config):
    import torch
    if not torch.cuda.is_available():
        return "no CUDA device: tests marked gpu are deselected (make gpu-test runs them on a GPU machine)"


@pytest.fixture(scope="session")
def tiny():
    """family -> loaded (model, path) in float32 on the default device (cuda if present, else
    cpu), loaded once per session. On a GPU the Triton kernels compile for real; on a CPU they
    run through the interpreter."""
    import torch
    from l1_dense.checkpoint import load_model
    from plumbing.runtime import default_device
    from plumbing.tiny import tiny_checkpoint
    cache = {}

    def get(family="qwen3"):
        if family not in cache:
            path = tiny_checkpoint(family)
            cache[family] = (load_model(path, default_device(), torch.float32), path)
        return cache[family]
    return get


@pytest.fixture(scope="session")
def tiny_server():
    """(base URL, server): one stage-10 server on the tiny Qwen3 with the server's defaults, per
    test process, for every module that needs no server of its own (each start costs some 4 s
    of a 2-core VM). Its tests leave it idle (wait_idle) and judge counters by differences."""
    from l10_serving import running_server
    with running_server("tiny-qwen3") as (base, srv):
        yield base, srv


@pytest.fixture(scope="session")
def tiny_offline():
    """The offline oracle of the stage-10 tests: the latest stage's LLM built as the server's is."""
    from l10_serving import offline_llm
    return offline_llm()


def pytest_terminal_summary(terminalreporter, config):
    """The fuzzes' figures (stages 5, 6 and 11): workloads run and invariants checked."""
    n = getattr(config, "_gpu_deselected", 0)
    if n:
        terminalreporter.write_line(f"{n} GPU tests deselected: no CUDA device")
    for module, title in (("l5_fake", "l5 scheduler fuzz"), ("l6_fake", "l6 prefix-cache fuzz"),
                          ("l11_fake", "l11 speculative decoding fuzz")):
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

    def get(family="qwen3", dtype="float32", fp8_line=True, stages=None):
        key = (family, dtype, fp8_line, stages)
        if key not in cache:
            from check_chain import main
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                rc = main(["--model", f"tiny-{family}", "--dtype", dtype] + ([] if fp8_line else ["--no-fp8-line"])
                          + ([] if stages is None else ["--stages", stages]))
            cache[key] = (rc, out.getvalue())
        return cache[key]
    return get
