"""Install what the project needs into the running interpreter; `make install` calls this.

Run it with the interpreter to install into (the Makefile passes `.venv/bin/python`, the active
virtualenv's python, or PY=...). Standard library only: it runs before anything is installed.

Steps, each announced on one line starting with `install:` before pip's own (unabridged) output:

1. up to date?  A stamp file keyed on pyproject.toml and the interpreter, plus a check that this
   checkout is the one installed, lets a second `make test` skip everything (about 0.2 s). --force
   ignores the stamp.
2. torch.  Already installed and matching --torch: kept.  Otherwise the source is chosen and the
   reason printed: on Linux with no NVIDIA GPU, PyTorch's CPU index (the default index would pull
   the CUDA build, about 2.5 GB with its nvidia-* wheels; docs/install.md), probed first with a
   short timeout and falling back to the default index when it cannot be reached; on macOS,
   Windows or a machine with an NVIDIA GPU, the default index.  --torch-index overrides it.
3. this package, editable, with its test extra: `pip install -e ".[test]"`.  torch is already
   satisfied by then, so this step never re-resolves it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import time
import urllib.error
import urllib.request
from importlib import metadata
from urllib.parse import urlparse
from urllib.request import url2pathname

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
STAMPS = os.path.join(ROOT, ".install-stamps")  # one file per interpreter; gitignored
DIST = "triton-llm-lessons"
USED: set[str] = set()  # the Makefile settings this run acted on (the rest, if given, are reported)


def say(msg: str) -> None:
    print(f"install: {msg}", flush=True)


def fail(msg: str) -> None:
    print(f"install: error: {msg}", file=sys.stderr, flush=True)
    sys.exit(1)


def stamp_key() -> str:
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        pyproject = hashlib.sha256(f.read()).hexdigest()
    return json.dumps({"pyproject.toml": pyproject, "python": sys.executable, "prefix": sys.prefix})


def installed_here() -> bool:
    """Is this checkout (not another clone) installed, editable, in this interpreter?"""
    try:
        dist = metadata.distribution(DIST)
        direct = json.loads(dist.read_text("direct_url.json") or "{}")
    except (metadata.PackageNotFoundError, ValueError):
        return False
    url = direct.get("url", "")
    if not url.startswith("file:"):
        return False
    path = url2pathname(urlparse(url).path)
    return os.path.realpath(path) == os.path.realpath(ROOT)


def stamp_path() -> str:
    return os.path.join(STAMPS, hashlib.sha256(sys.executable.encode()).hexdigest()[:16])


def up_to_date() -> bool:
    try:
        with open(stamp_path()) as f:
            return f.read() == stamp_key() and installed_here()
    except OSError:
        return False


def nvidia_gpu() -> str | None:
    """Why we think there is an NVIDIA GPU (driver present), or None."""
    if os.path.exists("/proc/driver/nvidia"):
        return "/proc/driver/nvidia exists"
    smi = shutil.which("nvidia-smi")
    if smi:
        return f"{smi} is on PATH"
    return None


def torch_version() -> str | None:
    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return None


def satisfies(version: str, requirement: str) -> bool | None:
    """Does `version` satisfy `requirement` (e.g. torch==2.13.0)? None when we cannot tell."""
    try:
        from pip._vendor.packaging.requirements import Requirement  # pip is in every venv
    except ImportError:
        return None
    try:
        return Requirement(requirement).specifier.contains(version, prereleases=True)
    except Exception:  # an unparsable --torch: let pip report it
        return None


def probe(url: str, timeout: float) -> str | None:
    """None when `url` answers within `timeout` seconds, else the reason it did not."""
    try:
        req = urllib.request.Request(url.rstrip("/") + "/torch/", method="HEAD")
        with urllib.request.urlopen(req, timeout=timeout):
            return None
    except urllib.error.HTTPError as e:  # the host answered: reachable, but say what it said
        return None if e.code < 500 else f"HTTP {e.code}"
    except Exception as e:  # DNS, refused, timeout, TLS
        reason = getattr(e, "reason", None) or e
        return f"{type(reason).__name__}: {reason}"


def pip(*args: str) -> int:
    cmd = [sys.executable, "-m", "pip", "install", *args]
    print("+ " + " ".join(cmd), flush=True)
    return subprocess.call(cmd, cwd=ROOT)


def externally_managed() -> str | None:
    """The PEP 668 marker that makes pip refuse to install into this interpreter, or None."""
    marker = os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED")
    return marker if sys.prefix == sys.base_prefix and os.path.exists(marker) else None


def externally_managed_hint() -> None:
    marker = externally_managed()
    if marker:
        print(
            f"install: {sys.executable} is an externally managed system Python (PEP 668: {marker}),\n"
            "         so pip refuses to install into it. Drop PY=... and the Makefile makes and uses a\n"
            "         project virtualenv (.venv); or activate a virtualenv of your own and run make there.",
            file=sys.stderr,
            flush=True,
        )


def install_torch(spec: str, index: str, timeout: float, cpu_index: str) -> None:
    have = torch_version()
    USED.add("TORCH")
    if have is not None and satisfies(have, spec):
        say(f"torch {have} is already installed and matches {spec}: keeping it "
            f"(`{sys.executable} -m pip uninstall torch` first to reinstall it)")
        return
    USED.add("TORCH_INDEX")
    if have is not None:
        say(f"torch {have} is installed but does not match {spec}: replacing it")

    gpu = nvidia_gpu()
    fallback = False
    if index == "auto":
        if sys.platform.startswith("linux") and gpu is None:
            url, fallback = cpu_index, True
            USED.update(("TORCH_CPU_INDEX", "TORCH_PROBE_TIMEOUT"))
            why = ("Linux with no NVIDIA GPU (no /proc/driver/nvidia, no nvidia-smi on PATH): "
                   "the CPU wheel from PyTorch's CPU index, not the default index's CUDA build "
                   "(~2.5 GB with its nvidia-* wheels)")
        elif sys.platform.startswith("linux"):
            url, why = None, f"Linux with an NVIDIA GPU ({gpu}): the default index's CUDA build"
        elif sys.platform == "darwin":
            url, why = None, "macOS: the default index's wheel is the CPU/MPS build"
        else:
            url, why = None, f"{sys.platform}: the default index's wheel"
    elif index == "default":
        url, why = None, "TORCH_INDEX=default"
    elif index == "cpu":
        USED.add("TORCH_CPU_INDEX")
        url, why = cpu_index, "TORCH_INDEX=cpu (no fallback: you asked for this index)"
    elif index.startswith(("http://", "https://", "file:")):
        url, why = index, f"TORCH_INDEX={index} (no fallback: you asked for this index)"
    else:
        raise AssertionError(index)  # main() validated it

    say(f"torch source: {url or 'the default package index'}; why: {why}")
    if url is not None and fallback:
        t0 = time.monotonic()
        problem = probe(url, timeout)
        if problem is None:
            say(f"{url} answered in {time.monotonic() - t0:.1f} s")
        else:
            say(f"{url} is unreachable within {timeout:g} s ({problem}): "
                "falling back to the default package index")
            url = None
    if url is not None:
        rc = pip("--index-url", url, "--timeout", "15", "--retries", "1", spec)
        if rc != 0 and fallback and not externally_managed():
            say(f"pip could not install {spec} from {url} (exit {rc}): "
                "falling back to the default package index")
            url = None
        elif rc != 0:
            externally_managed_hint()
            fail(f"pip could not install {spec} from {url} (exit {rc}); see pip's message above")
    if url is None:
        rc = pip(spec)
        if rc != 0:
            externally_managed_hint()
            fail(f"pip could not install {spec} (exit {rc}); see pip's message above")

    got = torch_version()
    cuda = sorted(d.metadata["Name"] for d in metadata.distributions()
                  if (d.metadata["Name"] or "").lower().startswith("nvidia-"))
    build = "CUDA build, with " + ", ".join(cuda) if cuda else "no nvidia-* wheels"
    say(f"installed torch {got} ({build})")
    if cuda and gpu is None:
        say("note: this is the CUDA build on a machine with no NVIDIA GPU; it runs on CPU but takes "
            "~2.5 GB. For the CPU wheel: make install FORCE=1 TORCH_INDEX=cpu after "
            f"`{sys.executable} -m pip uninstall -y torch`")


def report_ignored(args: argparse.Namespace, why: str) -> None:
    values = {"TORCH": args.torch, "TORCH_INDEX": args.torch_index,
              "TORCH_CPU_INDEX": args.cpu_index, "TORCH_PROBE_TIMEOUT": f"{args.probe_timeout:g}"}
    unused = [n for n in args.given.split() if n in values and n not in USED]
    if unused:
        say("ignored: " + " ".join(f"{n}={values[n]}" for n in unused) + f": {why}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--torch", default="torch==2.13.0", help="torch requirement to install first")
    ap.add_argument("--torch-index", default="auto", help="auto | cpu | default | an index URL")
    ap.add_argument("--given", default="",
                    help="names of the Makefile settings the user set (each is reported if unused)")
    ap.add_argument("--cpu-index", default=CPU_INDEX,
                    help="PyTorch's CPU index (TORCH_CPU_INDEX; point it elsewhere to test the fallback)")
    ap.add_argument("--probe-timeout", type=float, default=5.0,
                    help="seconds to wait for the CPU index before falling back")
    ap.add_argument("--why", default="", help="why this interpreter (printed)")
    ap.add_argument("--force", action="store_true", help="ignore the up-to-date stamp")
    args = ap.parse_args()

    if sys.version_info < (3, 10):
        fail(f"{sys.executable} is Python {sys.version.split()[0]}; this project needs >= 3.10. "
             "Use another interpreter: make ... BASE_PY=python3.11 (for the .venv) or PY=...")

    if args.torch_index not in ("auto", "cpu", "default") and not args.torch_index.startswith(
            ("http://", "https://", "file:")):
        fail(f"TORCH_INDEX={args.torch_index!r} is not auto, cpu, default or an index URL "
             "(e.g. TORCH_INDEX=https://download.pytorch.org/whl/cu130)")

    where = f"{sys.executable} (Python {sys.version.split()[0]})"
    if not args.force and up_to_date():
        say(f"up to date in {where}: pyproject.toml unchanged since the last install; skipping "
            "(make install FORCE=1 reinstalls)")
        report_ignored(args, "nothing was installed")
        return

    t0 = time.monotonic()
    say(f"into {where}" + (f", {args.why}" if args.why else ""))
    install_torch(args.torch, args.torch_index, args.probe_timeout, args.cpu_index)
    report_ignored(args, "not needed for this install (see the torch lines above)")
    say('this package and its test extra: pip install -e ".[test]"')
    rc = pip("-e", ".[test]")
    if rc != 0:
        externally_managed_hint()
        fail(f'pip install -e ".[test]" failed (exit {rc}); see pip\'s message above')
    os.makedirs(STAMPS, exist_ok=True)
    with open(stamp_path(), "w") as f:
        f.write(stamp_key())
    say(f"done in {time.monotonic() - t0:.0f} s; the next make demo/test skips this step "
        "until pyproject.toml changes")


if __name__ == "__main__":
    main()
