"""The repository as a learner finds it: nothing tracked that a run writes, every result written by a
benchmark that still exists, scripts/ (what a learner runs) apart from benchmarks/ (measurement),
imports that point down, no sys.path patching, links that resolve, and Ctrl-C that stops a script
with one line.

Each check is a function over its inputs (file texts, paths), run once on the repository and once
on a planted violation, so none passes over nothing.
"""
from __future__ import annotations

import ast
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RESULT_NAME = re.compile(r"[a-z0-9][a-z0-9-]*\.(json|md|png)")


def _git(*args) -> list[str] | None:
    try:
        out = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.splitlines() if out.returncode == 0 else None


# ---- nothing a run writes is tracked -------------------------------------------------------

def tracked_outputs(tracked: list[str], exists=lambda f: (ROOT / f).exists()) -> list[str]:
    """Tracked files under out/ or .scratch/ (where runs write) that are in the working tree (a
    deletion not yet committed is still in git's index: it does not count)."""
    return [f for f in tracked if f.split("/")[0] in ("out", ".scratch") and exists(f)]


def test_no_tracked_file_under_out_or_scratch():
    tracked = _git("ls-files", "out", ".scratch")
    if tracked is None:
        pytest.skip("not a git checkout")
    assert not tracked_outputs(tracked), f"tracked run outputs: {tracked_outputs(tracked)}"
    ignored = _git("check-ignore", "out/x.json", ".scratch/x.json")
    assert ignored == ["out/x.json", ".scratch/x.json"], ".gitignore must ignore out/ and .scratch/"


# ---- benchmarks/results/<benchmark>/<gpu>.{json,md,png} ----------------------------------------

def benchmark_names(root: Path) -> set[str]:
    return {p.stem for d in ("benchmarks", "benchmarks/studies") for p in (root / d).glob("*.py")}


def misplaced_results(files: list[Path], results: Path, names: set[str]) -> list[str]:
    """Result files not at results/<a benchmark that exists>/<gpu>.{json,md,png}."""
    bad = []
    for f in files:
        parts = f.relative_to(results).parts
        if len(parts) != 2 or parts[0] not in names or not RESULT_NAME.fullmatch(parts[1]):
            bad.append(str(f.relative_to(results)))
    return bad


def test_every_result_sits_under_a_benchmark_that_exists():
    results = ROOT / "benchmarks" / "results"
    files = [p for p in results.rglob("*") if p.is_file()]
    assert files, "benchmarks/results/ is empty"
    bad = misplaced_results(files, results, benchmark_names(ROOT))
    assert not bad, f"not <benchmark>/<gpu>.{{json,md,png}} of an existing benchmark: {bad}"


# ---- imports: scripts/ apart from benchmarks/, every import pointing down ----------------------

def modules(root: Path) -> dict[str, Path]:
    """Module name -> file: scripts/ by file name (run as files, they import each other so), benchmarks
    by package path."""
    out = {p.stem: p for p in (root / "scripts").glob("*.py")}
    out.update({f"benchmarks.{p.stem}": p for p in (root / "benchmarks").glob("*.py") if p.stem != "__init__"})
    out.update({f"benchmarks.studies.{p.stem}": p for p in (root / "benchmarks" / "studies").glob("*.py")
                if p.stem != "__init__"})
    return out


def imports_of(text: str) -> list[str]:
    """Every module a source imports, anywhere in it (inside functions too)."""
    names = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.append(node.module)
            names += [f"{node.module}.{a.name}" for a in node.names]
    return names


def edges(texts: dict[str, str]) -> dict[str, set[str]]:
    """name -> the names among ``texts`` it imports."""
    return {name: {m for m in imports_of(text) if m in texts} for name, text in texts.items()}


def script_imports_of_benchmarks(texts: dict[str, str]) -> list[str]:
    return [f"{name} imports {m}" for name, text in texts.items() if "." not in name
            for m in imports_of(text) if m.split(".")[0] == "benchmarks" or m.startswith("bench")]


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of a graph (each found once, from the first module of it met)."""
    found, state = [], {}

    def visit(node, stack):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                found.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, stack)
        stack.pop()
        state[node] = "done"
    for node in sorted(graph):
        if node not in state:
            visit(node, [])
    return found


def path_patches(text: str) -> list[int]:
    """Lines that touch sys.path (or import the old _path helper)."""
    lines = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Attribute) and node.attr == "path" and getattr(node.value, "id", None) == "sys":
            lines.append(node.lineno)
        elif isinstance(node, ast.Import) and any(a.name == "_path" for a in node.names):
            lines.append(node.lineno)
    return lines


@pytest.fixture(scope="module")
def texts():
    return {name: path.read_text() for name, path in modules(ROOT).items()}


def test_scripts_import_nothing_from_benchmarks(texts):
    assert not script_imports_of_benchmarks(texts)


def test_no_import_circle_among_scripts_and_benchmarks(texts):
    assert not cycles(edges(texts)), f"import circles: {cycles(edges(texts))}"


def test_no_sys_path_patching_in_scripts_or_benchmarks(texts):
    bad = {name: lines for name, text in texts.items() if (lines := path_patches(text))}
    assert not bad, f"sys.path touched (module: lines): {bad}; the project is installed, run files or -m"


# ---- links in the README and the lessons -------------------------------------------------------

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def broken_links(doc: Path, text: str) -> list[str]:
    """Relative link targets of a markdown text (code blocks and spans left out) that are not files."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    text = re.sub(r"`[^`\n]*`", "", text)
    bad = []
    for target in LINK.findall(text):
        path = target.split("#", 1)[0]
        if not path or re.match(r"[a-z]+:", path):
            continue
        if not (doc.parent / path).exists():
            bad.append(f"{doc.relative_to(ROOT)} -> {target}")
    return bad


def test_every_relative_link_in_the_readme_and_lessons_resolves():
    docs = [ROOT / "README.md", *sorted((ROOT / "lessons").rglob("*.md"))]        # lesson 7: index and chapters
    bad = [b for doc in docs for b in broken_links(doc, doc.read_text())]
    assert not bad, "links to nothing:\n" + "\n".join(bad)


README_MAX_LINES = 200        # a user guide, not a log: measurements live in benchmarks/results and git


def long_readme(text: str) -> str | None:
    n = len(text.splitlines())
    return f"README.md has {n} lines (at most {README_MAX_LINES}): move detail to docs/ or a lesson" \
        if n > README_MAX_LINES else None


def test_the_readme_stays_a_guide():
    problem = long_readme((ROOT / "README.md").read_text())
    assert problem is None, problem


# ---- each check fails on a planted violation ----------------------------------------------------

def test_each_check_fails_on_a_planted_violation():
    planted = [".scratch/gpu1/bench_spec.json", "out/bench_l7/bench_l7.md", "docs/install.md"]
    assert tracked_outputs(planted, exists=lambda f: True) == planted[:2]
    results = ROOT / "benchmarks" / "results"
    names = benchmark_names(ROOT)
    assert misplaced_results([results / "bench_gone" / "h100.json"], results, names)
    assert misplaced_results([results / "bench_l7" / "bench_l7_h100_nov26.json"], results, names)
    assert misplaced_results([results / "bench_l7" / "h100.txt"], results, names)
    assert script_imports_of_benchmarks({"l1_smoke": "from benchmarks.bench_common import free\n"})
    assert script_imports_of_benchmarks({"l8_blocks_held": "def f():\n    from bench_common import pyplot\n"})
    assert cycles(edges({"a": "import b\n", "b": "def f():\n    from a import x\n"})) == [["a", "b", "a"]]
    assert cycles(edges({"benchmarks.x": "from benchmarks.y import f\n", "benchmarks.y": "import benchmarks.x\n"}))
    assert path_patches("import sys\nsys.path.insert(0, '.')\n") == [2]
    assert path_patches("import _path  # noqa: F401\n") == [1]
    planted = "[the results](../docs/bench_gone_h100.json) and [ok](l1_dense.md#the-skeleton) `[x](nowhere)`"
    assert broken_links(ROOT / "lessons" / "l1_dense.md", planted) == ["lessons/l1_dense.md -> ../docs/bench_gone_h100.json"]
    assert long_readme("line\n" * (README_MAX_LINES + 1)) and not long_readme("line\n" * README_MAX_LINES)


# ---- Ctrl-C: one line, exit 130 ---------------------------------------------------------------

def _ctrl_c_as_in_a_terminal():
    """SIGINT's default action in the child, as a terminal's foreground job has it: a test run
    started in the background (``make test &``) ignores SIGINT, and a child inherits that, so
    Python would never raise KeyboardInterrupt and the script would run to its end."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _interrupt(argv: list, started, timeout: float) -> tuple[int, str]:
    """Run ``argv``, read its stderr until ``started(line)``, send SIGINT; (exit status, all its stderr)."""
    p = subprocess.Popen(argv, cwd=ROOT, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         preexec_fn=_ctrl_c_as_in_a_terminal)
    head = []
    try:
        while not started(line := p.stderr.readline()):
            assert line and p.poll() is None, f"{argv[-1]} exited before it started"
            head.append(line)
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=timeout)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    return p.returncode, "".join(head) + line + err


def test_ctrl_c_stops_a_script_with_one_line_and_status_130():
    """check_chain.py on the tiny model, interrupted once it has started comparing stages: the
    shell's status for SIGINT and one line on stderr, not a traceback."""
    rc, err = _interrupt([sys.executable, str(ROOT / "scripts" / "check_chain.py")],
                         lambda line: line.startswith("  ..."), 120)    # "  ... l1_dense: 0.0 s": main is running
    lines = [ln for ln in err.splitlines() if not ln.startswith("  ... ")]
    assert rc == 130, f"exit status {rc}; stderr:\n{err}"
    assert "Traceback" not in err
    assert len(lines) == 1 and "interrupt" in lines[0].lower(), f"stderr after the progress lines: {lines}"


def test_ctrl_c_while_a_benchmark_loads_torch_is_one_line_and_sigint_status():
    """A benchmark interrupted before its main() runs (flags parsed, torch still importing): one
    line, and the process ends by SIGINT (the shell shows 130). Without benchmarks/__init__.py's
    hook this prints torch's import traceback."""
    rc, err = _interrupt([sys.executable, "-X", "importtime", str(ROOT / "benchmarks" / "bench_e2e.py"), "--quick"],
                         lambda line: "benchmarks.outputs" in line, 60)  # -X importtime: a line per module; then torch
    lines = [ln for ln in err.splitlines() if not ln.startswith("import time:")]
    assert rc in (-signal.SIGINT, 130), f"exit status {rc}; stderr:\n{err[-2000:]}"
    assert lines == ["interrupted (Ctrl-C)"], lines[-20:]


def uninstalled_packages(root: Path) -> list[str]:
    """Top-level packages (folders with an __init__.py) that pyproject.toml's package list leaves out:
    an editable install would not find them from another folder (a script, a fresh clone)."""
    import fnmatch                                           # (tomllib is 3.11+: the project supports 3.10)
    line = re.search(r"^include = \[(.*)\]$", (root / "pyproject.toml").read_text(), re.M)
    include = re.findall(r'"([^"]+)"', line.group(1)) if line else []
    return sorted(d.name for d in root.iterdir() if (d / "__init__.py").exists() and d.name not in ("tests",)
                  and not any(fnmatch.fnmatch(d.name, pat) for pat in include))


def test_every_package_is_in_pyprojects_list(tmp_path):
    assert uninstalled_packages(ROOT) == []
    (tmp_path / "pyproject.toml").write_text('[tool.setuptools.packages.find]\ninclude = ["l1_dense*"]\n')
    for name in ("l1_dense", "l12_new_stage"):                 # planted: a stage the list forgets
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text("")
    assert uninstalled_packages(tmp_path) == ["l12_new_stage"]
