"""The GPU measurements: each benchmark against a peer measured in the same run and against the
roofline of the machine it runs on (docs/benchmarks.md says what each measures and what limits it).

    python -m benchmarks.bench_l7              # or: python benchmarks/bench_l7.py
    python -m benchmarks.bench_l7 --quick      # a smoke test of the script, CPU ok: no verdicts

A full run on a GPU writes ``benchmarks/results/<benchmark>/<gpu>.{json,md,png}`` (the latest run
per GPU kind, tracked); ``--quick``, a CPU and ``--out DIR`` write under ``out/`` or DIR instead.
``benchmarks/studies/`` holds one-off studies whose figures a lesson quotes. Imports point down:
a benchmark imports its report and the shared helpers (``bench_common``, ``timing``,
``attention_peers``, ``kernel_bench``, ``outputs``), and no helper imports a benchmark; nothing
in ``scripts/`` imports from here.
"""
import sys


def _one_line_on_ctrl_c(kind, value, tb, _default=sys.excepthook):
    """Ctrl-C before a benchmark's main() runs (while torch loads): one line, not torch's import
    traceback. CPython then ends the process by SIGINT, so the shell sees status 130 as it does
    from plumbing.cli.run_main."""
    if issubclass(kind, KeyboardInterrupt):
        print("interrupted (Ctrl-C)", file=sys.stderr, flush=True)
    else:
        _default(kind, value, tb)


sys.excepthook = _one_line_on_ctrl_c
