"""Engine options, each declared once: a name, a default, a check, a line of help, a group.

A stage declares the options it adds in its own ``options.py`` (``l6_prefix_cache/options.py``:
``enable_prefix_caching``). Everything that takes options is generated from those declarations:

    LLM(**options)             the values are checked here (``resolve``) before anything loads
    command-line flags         ``add_flags``: --kebab-case, bools as --x / --no-x, dicts as JSON
    the engine's parts         read the checked values (``Values``: ``args.kv_cache_dtype``)

Groups follow vLLM's configuration objects: model, cache, scheduler, speculative, parallel; ours
add kernels (which Triton paths run) and debug. ``part`` names the engine part an option sets, so
the table of options (``scripts/engine_options.py``) says what each one changes.

Nothing here knows any stage: the declarations are handed in.
"""
from __future__ import annotations

import argparse
import difflib
import json
from dataclasses import dataclass
from typing import Callable

from .errors import UserError

GROUPS = ("model", "cache", "scheduler", "speculative", "parallel", "kernels", "debug")


@dataclass(frozen=True)
class Option:
    name: str                       # the keyword of LLM(...) and, as --kebab-case, the flag
    default: object
    help: str                       # one line
    group: str                      # one of GROUPS
    part: str                       # the engine part it configures ("kv_manager", "sizes", ...)
    kind: type | None = None        # int, float, str, bool or dict; None: the default's type
    choices: tuple = ()
    check: Callable | None = None   # value -> value (may convert), raises UserError; after the kind check
    none_ok: bool = False           # None is a value (usually "derive it"), not only the default

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def type(self) -> type:
        return self.kind or type(self.default)

    def validate(self, value):
        """The value as the engine will use it, or a UserError naming the option and the fix."""
        if value is None and (self.none_ok or self.default is None):
            return None
        t, bad = self.type, False
        if t is float:
            bad = isinstance(value, bool) or not isinstance(value, (int, float))
            value = value if bad else float(value)
        elif t is int:
            bad = isinstance(value, bool) or not isinstance(value, int)
        else:
            bad = not isinstance(value, t)
        if bad:
            article = "an" if t.__name__[0] in "aeiou" else "a"
            raise UserError(f"{self.name} must be {article} {t.__name__}, got {value!r} ({self.help}).")
        if self.choices and value not in self.choices:
            raise UserError(f"{self.name} must be one of {', '.join(map(repr, self.choices))}, got {value!r}.")
        return self.check(value) if self.check else value


def positive(name: str):
    """A check: a positive int (None, where allowed, is handled before checks run)."""
    def check(v):
        if v < 1:
            raise UserError(f"{name} must be a positive integer, got {v!r} (leave it out for the default).")
        return v
    return check


class Values:
    """Checked option values, by attribute (``args.block_size``), with the declarations they came from."""

    def __init__(self, options: dict[str, Option], given: dict):
        self.options = options
        self.given = dict(given)                     # what the caller passed, before defaults
        for name, opt in options.items():
            setattr(self, name, opt.validate(given[name]) if name in given else opt.default)

    def asdict(self) -> dict:
        return {name: getattr(self, name) for name in self.options}

    def __repr__(self):
        return f"Values({', '.join(f'{k}={v!r}' for k, v in self.asdict().items())})"


def resolve(options: dict[str, Option], given: dict, unknown_hint: Callable[[str], str] = lambda name: "") -> Values:
    """Check every given option against its declaration; an unknown one is one UserError, with
    ``unknown_hint(name)`` (e.g. "stage 9 (l9_fp8_kv) adds it") when the caller can say more."""
    unknown = sorted(set(given) - set(options))
    if unknown:
        name = unknown[0]
        hint = unknown_hint(name)
        close = difflib.get_close_matches(name, options, n=1)
        raise UserError(f"unknown option {name!r}" + (f": {hint}." if hint else f": did you mean {close[0]!r}?" if close
                        else f"; this engine's options are {', '.join(sorted(options))}."))
    return Values(options, given)


def _parse_json(opt: Option):
    def parse(text: str):
        try:
            v = json.loads(text)
        except json.JSONDecodeError as e:
            raise argparse.ArgumentTypeError(f"not JSON ({e.msg}): {text!r}") from None
        if not isinstance(v, dict):
            raise argparse.ArgumentTypeError(f"a JSON object is needed, like '{{\"method\": \"ngram\"}}', got {text!r}")
        return v
    parse.__name__ = "JSON object"
    return parse


def add_flags(parser: argparse.ArgumentParser, options, defaults: dict | None = None, skip=()) -> None:
    """One flag per option, in argparse groups named after the option groups. A flag left out is
    None in the namespace (the option's default then applies; ``defaults`` overrides a default,
    e.g. a smoke script's small pool, and the help says which applies)."""
    defaults = defaults or {}
    groups: dict[str, argparse._ArgumentGroup] = {}
    for opt in options:
        if opt.name in skip:
            continue
        g = groups.get(opt.group) or groups.setdefault(opt.group, parser.add_argument_group(f"{opt.group} options"))
        default = defaults.get(opt.name, opt.default)
        shown = json.dumps(default) if isinstance(default, dict) else default
        help_ = opt.help if "default" in opt.help and opt.name not in defaults else f"{opt.help} (default: {shown})"
        if opt.type is bool:
            g.add_argument(opt.flag, action=argparse.BooleanOptionalAction, default=None, help=help_)
        elif opt.type is dict:
            g.add_argument(opt.flag, type=_parse_json(opt), default=None, metavar="JSON", help=help_)
        else:                                        # (a kind of ``object`` is parsed from its text by its check)
            g.add_argument(opt.flag, type=str if opt.type is object else opt.type, default=None,
                           choices=opt.choices or None, help=help_)


def given_flags(ns: argparse.Namespace, options, defaults: dict | None = None, skip=()) -> dict:
    """The options the command line gave (``add_flags``), plus the caller's ``defaults`` for the
    rest: the keyword arguments of LLM(...)."""
    out = dict(defaults or {})
    for opt in options:
        if opt.name in skip:
            continue
        v = getattr(ns, opt.name, None)
        if v is not None:
            out[opt.name] = v
    return out
