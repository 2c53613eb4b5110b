"""Run a pytest tier as N processes at once, one per core: what `make test` (and the other tiers) call.

    python scripts/run_tests.py -- -m "not lessons and not deep"         # make test
    python scripts/run_tests.py --jobs 1 -- -m lessons -k chain           # one process: plain pytest
    python scripts/run_tests.py --record -- -m lessons                    # re-measure the shard weights

Its own flags come first; everything after ``--`` goes to pytest.

The suite is interpreter-bound Python: one process keeps one core busy. Each of the N processes
runs ``pytest --shard I/N`` (tests/shards.py: whole files, balanced by their measured seconds) with
one torch thread, writing to its own log; this script prints a line as each starts and ends and
every minute while they run, then each shard's failures, slowest tests and summary, and the total.
Exit status: the first failing shard's (0 when all pass; 5 when no test ran at all). Ctrl-C stops
every shard. ``--record`` adds ``--durations=0`` and writes each file's seconds for this tier to
tests/shard_weights.json (only balance depends on them, never a result).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from shards import TIERS, WEIGHTS, unit  # noqa: E402

SUMMARY = re.compile(r"^=*\s*(\d+ (?:passed|failed|errors?|skipped|deselected|xfailed|xpassed|warnings?)\b.*\bin [\d.]+s.*?)\s*=*$")
COUNT = re.compile(r"(\d+) (passed|failed|errors?|skipped|xfailed|xpassed|warnings?)")
TAIL_FROM = re.compile(r"^=+ (FAILURES|ERRORS|slowest .*durations|short test summary info) =+$")
DURATION = re.compile(r"^([\d.]+)s (?:call|setup|teardown)\s+(\S+::.*?)\s*$")


def markexpr(args: list[str]) -> str:
    for j, a in enumerate(args):
        if a == "-m" and j + 1 < len(args):
            return args[j + 1]
        if a.startswith("-m") and len(a) > 2:
            return a[2:]
    return ""


def tail(log: str) -> str:
    """From the first FAILURES / ERRORS / durations / summary section to the end."""
    lines = log.splitlines()
    start = next((j for j, line in enumerate(lines) if TAIL_FROM.match(line)), max(0, len(lines) - 3))
    return "\n".join(lines[start:])


def record(logs: list[str], tier: str) -> None:
    seconds: dict[str, float] = {}
    for log in logs:
        for line in log.splitlines():
            m = DURATION.match(line)
            if m:
                u = unit(m[2])
                seconds[u] = seconds.get(u, 0.0) + float(m[1])
    if not seconds:
        sys.exit("run_tests: --record found no durations in the logs; nothing written")
    weights = json.loads(WEIGHTS.read_text()) if WEIGHTS.exists() else {}
    weights[tier] = {f: round(s, 1) for f, s in sorted(seconds.items())}
    WEIGHTS.write_text(json.dumps(weights, indent=1, sort_keys=True) + "\n")
    print(f"run_tests: wrote {len(seconds)} units' seconds for {tier!r} to {WEIGHTS.relative_to(ROOT)}")


def parse(argv: list[str]):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                epilog="everything after -- goes to pytest, e.g. -- -m lessons -k chain")
    p.add_argument("--jobs", type=int, default=min(os.cpu_count() or 1, 4),
                   help="processes at once (default: the CPU count, at most 4); 1 runs plain pytest")
    p.add_argument("--record", action="store_true", help="write this tier's per-file seconds to tests/shard_weights.json")
    cut = argv.index("--") if "--" in argv else len(argv)
    args, rest = p.parse_args(argv[:cut]), argv[cut + 1:]
    if args.jobs < 1:
        p.error(f"--jobs {args.jobs}: expected 1 or more")
    tier = TIERS.get(markexpr(rest).strip())
    if args.record and tier is None:
        p.error(f"--record: -m {markexpr(rest)!r} is not one of make's tiers ({', '.join(map(repr, TIERS))})")
    return args, rest, tier


def last_summary(log: str) -> str | None:
    found = [m[1] for m in map(SUMMARY.match, log.splitlines()) if m]
    return found[-1] if found else None


def wait(procs, files, t0: float) -> list[int]:
    """Every shard's exit status, a line as each ends and one a minute while any runs."""
    rcs: list[int | None] = [None] * len(procs)
    last = time.monotonic()
    while None in rcs:
        time.sleep(0.5)
        for i, proc in enumerate(procs):
            if rcs[i] is None and proc.poll() is not None:
                rcs[i] = proc.returncode
                print(f"run_tests: shard {i}/{len(procs)} exited {rcs[i]} after {time.monotonic() - t0:.0f} s: "
                      f"{last_summary(files[i].read_text()) or 'no summary line (see its log)'}", flush=True)
        if time.monotonic() - last >= 60 and None in rcs:
            last = time.monotonic()
            running = [str(i) for i, rc in enumerate(rcs) if rc is None]
            print(f"run_tests: {time.monotonic() - t0:.0f} s, shard(s) {', '.join(running)} still running", flush=True)
    return rcs


def report(logs: list[str], rcs: list[int], t0: float) -> int:
    """Each shard's tail, then the counts added up. A shard with nothing selected exits 5: fine
    if another ran tests; none at all is exit 5, never an OK."""
    totals: dict[str, int] = {}
    for i, log in enumerate(logs):
        print(f"\n{'#' * 30} shard {i}/{len(logs)} {'#' * 30}\n{tail(log)}")
        for n, what in COUNT.findall(last_summary(log) or ""):
            key = what.rstrip("s") if what.startswith(("error", "warning")) else what
            totals[key] = totals.get(key, 0) + int(n)
    failed = [rc for rc in rcs if rc not in (0, 5)]
    ran = sum(totals.get(k, 0) for k in ("passed", "failed", "error", "xfailed", "xpassed"))
    rc = failed[0] if failed else (0 if ran else 5)
    said = ", ".join(f"{n} {k}" for k, n in totals.items()) or "no test ran"
    print(f"\nrun_tests: {said} in {time.monotonic() - t0:.0f} s over {len(logs)} processes, exit {rc}")
    return rc


def main(argv: list[str] | None = None) -> int:
    args, rest, tier = parse(sys.argv[1:] if argv is None else argv)
    if args.jobs == 1 and not args.record:
        return subprocess.call([sys.executable, "-m", "pytest", *rest], cwd=ROOT)
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"),
               MKL_NUM_THREADS=os.environ.get("MKL_NUM_THREADS", "1"))
    extra = ["--durations=0"] if args.record else []
    logdir = Path(tempfile.mkdtemp(prefix="run-tests-"))
    files = [logdir / f"shard{i}.log" for i in range(args.jobs)]
    t0 = time.monotonic()
    procs = [subprocess.Popen([sys.executable, "-m", "pytest", f"--shard={i}/{args.jobs}", "-p", "no:cacheprovider",
                               *rest, *extra], cwd=ROOT, env=env, stdout=f.open("w"), stderr=subprocess.STDOUT)
             for i, f in enumerate(files)]
    print(f"run_tests: {args.jobs} pytest processes (--shard I/{args.jobs}), logs in {logdir}", flush=True)
    try:
        rcs = wait(procs, files, t0)
    except KeyboardInterrupt:
        for proc in procs:
            proc.terminate()
        print(f"\nrun_tests: interrupted; every shard stopped (logs in {logdir})")
        return 130
    logs = [f.read_text() for f in files]
    rc = report(logs, rcs, t0)
    if args.record:
        record(logs, tier)
    return rc


if __name__ == "__main__":
    sys.exit(main())
