"""The shape of the code, as checks over source files (tests/test_structure.py runs them, each also on
a planted violation). Each check takes a file (anything with ``read_text``, ``parent`` and
``relative_to``) and returns its problems, one line each.

    imports        no stage folder imports a higher floor (l3_paged never imports l5_scheduler ...)
    plumbing       plumbing, the ground floor, imports no stage at all
    length         no file over 300 lines and no function over 60, outside tests
    subclasses     one engine loop: nothing subclasses LLMEngine, Scheduler or LLM
    depth          a class is at most two levels below its project base; from stage 5 on a part
                   never subclasses another stage's class (but for the few bases listed, with why)
    later names    a stage never names a later stage, nor a later stage's feature, in code or
                   comments (refusals may: an error names the stage that does what it refuses)
    runtime first  a module that imports Triton imports plumbing.runtime before it
    builders       no stage calls another stage's builder or inspects signatures
    rebinding      no stage folder replaces a method on an object: ``x.forward = ...``, ``setattr(x,
                   "forward", ...)``, or a function (a lambda, a def, a bound method) assigned to
                   another object's attribute that a project class defines as a method (a
                   callback slot that is no method's name is fine); a part, not a patch
"""
from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STAGES = sorted((p.name for p in ROOT.glob("l[0-9]*_*") if p.is_dir()), key=lambda n: int(n[1:].split("_")[0]))
CODE = [p for d in [*STAGES, "plumbing", "harness", "scripts", "benchmarks", "benchmarks/studies"]
        for p in sorted((ROOT / d).glob("*.py"))]
MAX_FILE, MAX_FUNCTION = 300, 60

#: a later stage's feature, by the stage that introduces it: the words no earlier stage may use
FEATURES = {6: [r"prefix.cach"], 7: [r"\bpdl\b", r"programmatic dependent", r"\basync", r"cuda.graph", r"overlapped"],
            8: [r"sliding.window", r"\bwindow"], 9: [r"e4m3", r"\bfp8"],
            11: [r"speculat", r"\bdrafts?\b", r"\bdrafter", r"\bverif", r"\bguess"],
            12: [r"tensor.parallel", r"all.reduce", r"\bgloo\b", r"\bnccl\b"]}
#: (folder, stage whose words it may use): why
NAMES_ALLOWED = {("l1_dense", 8): "the skeleton reads the whole checkpoint config, windows included, so that "
                                  "an engine without them refuses a windowed checkpoint instead of running it"}
#: vLLM API names an earlier stage carries, blanked before the feature words are looked for: why
API_ALLOWED = {"reset_prefix_cache": "vLLM's LLM method; stage 5's LLM is the one LLM every stage's assembler builds"}
#: bases a later stage's class may extend: why
BASES_ALLOWED = {"BlockAllocator": "stage 5's KV manager is stage 2's allocator plus the scheduler's calls",
                 "PagedMeta": "a step's metadata record, extended with fields (no behaviour)",
                 "FastMeta": "a step's metadata record, extended with fields (no behaviour)"}


def floor(name: str) -> int | None:
    """l5_scheduler -> 5; anything else (plumbing, torch, ...) -> None."""
    head = name.split(".")[0]
    return int(head[1:].split("_")[0]) if head in STAGES else None


def imported(tree) -> list[str]:
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.append(node.module)
    return out


def higher_floor_imports(path) -> list[str]:
    own = floor(path.parent.name)
    if own is None:
        return []
    return [f"{path.relative_to(ROOT)}: imports {n}" for n in imported(ast.parse(path.read_text()))
            if (floor(n) or 0) > own]


def plumbing_imports(path) -> list[str]:
    if path.parent.name != "plumbing":
        return []
    return [f"{path.relative_to(ROOT)}: imports {n}" for n in imported(ast.parse(path.read_text()))
            if floor(n) is not None]


def too_long(path) -> list[str]:
    text = path.read_text()
    out = [f"{path.relative_to(ROOT)}: {text.count(chr(10))} lines"] if text.count("\n") > MAX_FILE else []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            n = node.end_lineno - node.lineno + 1
            if n > MAX_FUNCTION:
                out.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}() is {n} lines")
    return out


def _bases(node: ast.ClassDef) -> list[str]:
    return [b.attr if isinstance(b, ast.Attribute) else getattr(b, "id", "") for b in node.bases]


def engine_subclasses(path) -> list[str]:
    """Stage folders only: harness/plain_parts.py's oracle is the scheduler with one method written plainly."""
    if floor(path.parent.name) is None:
        return []
    return [f"{path.relative_to(ROOT)}: class {node.name}({b})" for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.ClassDef) for b in _bases(node) if b in ("LLMEngine", "Scheduler", "LLM")]


def class_index(paths) -> dict[str, tuple[str, list[str]]]:
    """Every class of the stage folders: name -> (its folder, its bases)."""
    out = {}
    for p in paths:
        if floor(p.parent.name) is not None:
            for node in ast.walk(ast.parse(p.read_text())):
                if isinstance(node, ast.ClassDef):
                    out.setdefault(node.name, (p.parent.name, _bases(node)))
    return out


@functools.lru_cache(maxsize=1)
def _code_index() -> dict:
    return class_index(CODE)


def class_depth(name: str, index: dict, seen=()) -> int:
    """Levels below its top project base (0: none in the project)."""
    ds = [class_depth(b, index, seen + (name,)) for b in index[name][1] if b in index and b not in seen]
    return 1 + max(ds) if ds else 0


def deep_classes(path, index=None) -> list[str]:
    own = floor(path.parent.name)
    if own is None:
        return []
    tree = ast.parse(path.read_text())
    index = dict(index if index is not None else _code_index())
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            index[node.name] = (path.parent.name, _bases(node))
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.ClassDef):
            continue
        if class_depth(node.name, index) > 2:
            out.append(f"{path.relative_to(ROOT)}: class {node.name} is {class_depth(node.name, index)} levels deep")
        out += [f"{path.relative_to(ROOT)}: class {node.name}({b}) extends {index[b][0]}'s class"
                for b in _bases(node) if own >= 5 and b in index and index[b][0] != path.parent.name
                and b not in BASES_ALLOWED]
    return out


def _refusal_lines(tree) -> set[int]:
    """Lines of raise statements (an error may name the stage that does what it refuses)."""
    return {i for r in ast.walk(tree) if isinstance(r, ast.Raise) for i in range(r.lineno, r.end_lineno + 1)}


def later_names(path) -> list[str]:
    own = floor(path.parent.name)
    if own is None:
        return []
    text = path.read_text()
    skip = _refusal_lines(ast.parse(text))
    out = []
    for i, line in enumerate(text.splitlines(), 1):
        if i in skip:
            continue
        for name in API_ALLOWED:
            line = line.replace(name, "")
        later = [m.group(0) for m in re.finditer(r"\b(?:stage|lesson)s? (\d+)|\bl(\d+)_[a-z]", line, re.I)
                 if int(m.group(1) or m.group(2)) > own]
        later += [pat for k, pats in FEATURES.items() if k > own and (path.parent.name, k) not in NAMES_ALLOWED
                  for pat in pats if re.search(pat, line, re.I)]
        if later:
            out.append(f"{path.relative_to(ROOT)}:{i}: names {later}: {line.strip()[:80]}")
    return out


def triton_before_runtime(path) -> list[str]:
    if floor(path.parent.name) is None:
        return []
    first: dict[str, int] = {}
    for node in ast.parse(path.read_text()).body:
        for n in imported(ast.Module(body=[node], type_ignores=[])):
            key = "runtime" if n.startswith("plumbing.runtime") else "triton" if n.split(".")[0] == "triton" else None
            if key:
                first.setdefault(key, node.lineno)
    if "triton" in first and first.get("runtime", 1 << 30) > first["triton"]:
        return [f"{path.relative_to(ROOT)}:{first['triton']}: imports triton before plumbing.runtime"]
    return []


def builder_calls(path) -> list[str]:
    own = floor(path.parent.name)
    if own is None:
        return []
    text, out = path.read_text(), []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.ImportFrom) and node.module and floor(node.module) not in (None, own):
            out += [f"{path.relative_to(ROOT)}: imports {a.name} from {node.module}" for a in node.names
                    if a.name in ("build_engine", "LLM")]
    if re.search(r"inspect\.signature", text):
        out.append(f"{path.relative_to(ROOT)}: inspects signatures")
    return out


def _function_value(value, local_functions: set) -> bool:
    """A value that is a function: a lambda, a function defined in the file, or a bound method (x.name
    where name is a method some class of the file defines)."""
    if isinstance(value, ast.Lambda):
        return True
    if isinstance(value, ast.Name):
        return value.id in local_functions
    return isinstance(value, ast.Attribute) and value.attr in local_functions


@functools.cache
def _project_methods() -> frozenset:
    """The names project classes define as methods (not properties: those are attributes)."""
    out = {"forward", "__call__"}
    for path in CODE:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                out |= {f.name for f in node.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                        and not f.decorator_list}
    return frozenset(out)


def rebound_methods(path) -> list[str]:
    if floor(path.parent.name) is None:
        return []
    tree = ast.parse(path.read_text())
    functions = {f.name for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))}
    methods = _project_methods()
    out = []
    for node in ast.walk(tree):
        found = []
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                own = isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id in ("self", "cls")
                if isinstance(t, ast.Attribute) and not own \
                        and t.attr in methods and (t.attr in ("forward", "__call__")
                                                   or _function_value(node.value, functions)):
                    found.append(t.attr)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr" \
                and len(node.args) == 3 and isinstance(node.args[1], ast.Constant) \
                and node.args[1].value in methods and (node.args[1].value in ("forward", "__call__")
                                                       or _function_value(node.args[2], functions)):
            found.append(node.args[1].value)
        out += [f"{path.relative_to(ROOT)}:{node.lineno}: replaces {name!r} on an object with a function (rebinds "
                "a method): make it a part" for name in found]
    return out


CHECKS = {"imports": higher_floor_imports, "plumbing": plumbing_imports, "length": too_long,
          "subclasses": engine_subclasses, "depth": deep_classes, "later names": later_names,
          "runtime first": triton_before_runtime, "builders": builder_calls, "rebinding": rebound_methods}
