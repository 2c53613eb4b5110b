"""The smoke-script interface every stage keeps (``scripts/l*_smoke.py``).

Flags: ``--model`` (path or hub id; default: the built-in tiny Qwen3), ``--prompt TEXT`` or
``--prompt-ids 1,2,3``, ``--max-new-tokens`` (20), ``--device`` (cuda if present, else cpu),
``--dtype`` (bfloat16 on cuda, float32 on cpu), ``--json``. A stage adds its own flags and
builds its own engine; this module loads the model, checks the input, runs and prints.

Nothing here imports torch at module level: a script parses and checks its flags first, so a
bad flag fails in milliseconds, before torch and triton load.

``--json`` prints one object with the keys ``stage, model, device, dtype, prompt_ids,
token_ids, text`` (plus stage extras such as ``finish_reason``, ``elapsed_s``, ``tokens_per_s``).
Notes about flags that are ignored or change what is compared go to stderr as ``note: ...``;
so does the progress of long runs (:class:`Watch`), never with ``--json``.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

from .errors import UserError
from .options import add_flags

DEFAULT_PROMPT = "The capital of France is"
DTYPE_NAMES = ("bfloat16", "float16", "float32")
NO_TEXT = "(text unavailable: this checkpoint has no tokenizer)"


class Parser(argparse.ArgumentParser):
    """argparse reads ``--prompt-ids -1,5,6`` as a flag followed by another flag; keep a value
    that starts with "-" attached to its id-list flag, so the range check can name it."""
    ID_LISTS = ("--prompt-ids", "--stop-token-ids")

    def parse_known_args(self, args=None, namespace=None):
        args = list(sys.argv[1:] if args is None else args)
        out, i = [], 0
        while i < len(args):
            if args[i] in self.ID_LISTS and i + 1 < len(args) and args[i + 1][:1] == "-" and args[i + 1][1:2].isdigit():
                out.append(f"{args[i]}={args[i + 1]}")
                i += 2
            else:
                out.append(args[i])
                i += 1
        return super().parse_known_args(out, namespace)

    def parse_args(self, args=None, namespace=None):
        """Parse, then check the base flags' values: a bad one fails here, before torch loads."""
        ns = super().parse_args(args, namespace)
        if getattr(ns, "max_new_tokens", 1) < 1:
            raise UserError(f"--max-new-tokens must be at least 1, got {ns.max_new_tokens}.")
        if getattr(ns, "prompt_ids", None) is not None:
            try:
                [int(t) for t in ns.prompt_ids.split(",") if t.strip()]
            except ValueError:
                raise UserError(f"--prompt-ids must be comma-separated integers, got {ns.prompt_ids!r}.") from None
        return ns


def note(msg: str) -> None:
    """A flag was ignored, or changes what the output can be compared with: say so, on stderr."""
    print(f"note: {msg}", file=sys.stderr)


def positive_or_none(flag: str, value: int | None) -> int | None:
    """None (flag not given) stays None; 0 or less (or a non-int) is an error, never a silent
    'use the default'. Used for flags and for API arguments (stage 5's engine limits)."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise UserError(f"{flag} must be a positive integer, got {value!r} (leave it out for the default).")
    return value


def base_parser(stage: str, doc: str, engine=None, defaults: dict | None = None, skip=()) -> argparse.ArgumentParser:
    """The smoke-script flags. ``engine``: the engine options of a scheduler stage
    (``lN_*.options.ENGINE_OPTIONS``), each a flag (plumbing/options.py; ``--model``, ``--device``
    and ``--dtype`` among them), with ``defaults`` for the script's run and ``skip`` left out."""
    p = Parser(prog=f"{stage}_smoke", description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    if engine is None:
        p.add_argument("--model", default=None, help="checkpoint directory, hub id, or a built-in tiny model: "
                       "tiny-qwen3 (default), tiny-llama, tiny-qwen2, tiny-mistral and tiny-qwen2-hybrid")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--prompt", default=None, help=f"prompt text (default: {DEFAULT_PROMPT!r})")
    g.add_argument("--prompt-ids", default=None, help="comma-separated token ids, e.g. 1,2,3")
    p.add_argument("--max-new-tokens", type=int, default=20)
    if engine is None:
        p.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
        p.add_argument("--dtype", default=None, choices=DTYPE_NAMES, help="default: bfloat16 on cuda, float32 on cpu")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    if engine is not None:
        add_flags(p, engine, defaults, skip)
    return p


def torch_dtype(name: str):
    """``"bfloat16"`` -> ``torch.bfloat16`` (one of DTYPE_NAMES)."""
    import torch
    return getattr(torch, name)


def dtype_name_of(dtype) -> str | None:
    """``torch.bfloat16`` -> ``"bfloat16"``; None for a dtype outside DTYPE_NAMES."""
    return next((n for n in DTYPE_NAMES if torch_dtype(n) == dtype), None)


def check_device_dtype(device: str, dtype_name: str):
    import torch
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise UserError("--device cuda was asked for but no CUDA device is visible: use --device cpu.")
    if not (device == "cpu" or device.startswith("cuda")):
        raise UserError(f"unknown --device {device!r}: use cuda or cpu.")
    dtype = torch_dtype(dtype_name)
    if device.startswith("cuda") and dtype == torch.bfloat16 and not torch.cuda.is_bf16_supported():
        raise UserError("this GPU does not support bfloat16: use --dtype float16 or float32.")
    try:  # the operations the model needs, in this dtype, on this device
        x = torch.ones(2, 1, 2, 8, device=device, dtype=dtype)
        torch.nn.functional.scaled_dot_product_attention(x, x, x) @ x.transpose(-1, -2)
    except RuntimeError as e:
        raise UserError(f"--dtype {dtype_name} is not supported on {device} ({str(e)[:80]}): use float32.") from None
    return dtype


def report(stage: str, ld: Loaded, token_ids: list[int], as_json: bool, extra: dict | None = None,
           lines: list[str] = ()) -> None:
    record = {"stage": stage, "model": ld.label, "device": ld.device, "dtype": ld.dtype_name,
              "prompt_ids": ld.prompt_ids, "token_ids": token_ids, "text": ld.text(token_ids), **(extra or {})}
    if as_json:
        print(json.dumps(record))
        return
    print(f"[{stage}] model={ld.label} device={ld.device} dtype={ld.dtype_name}")
    print(f"prompt     : {ld.text(ld.prompt_ids)!r}")
    print(f"prompt ids : {ld.prompt_ids}")
    print(f"token ids  : {token_ids}")
    print(f"text       : {record['text']!r}")
    for line in lines:
        print(line)


class Watch:
    """Wraps an engine (attributes pass through): counts the forward calls, one per new token, and
    prints progress on stderr every ``every_s`` seconds unless ``quiet``. On a CPU the Triton
    interpreter makes a long run slow; this shows it is moving, and how fast."""

    def __init__(self, engine, total: int, quiet: bool, every_s: float = 10.0):
        self.engine, self.total, self.quiet, self.every_s = engine, total, quiet, every_s
        self.t0 = self.last = time.perf_counter()
        self.n = 0

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def prefill(self, ids):
        return self._tick(self.engine.prefill(ids))

    def decode(self, token):
        return self._tick(self.engine.decode(token))

    def _tick(self, logits):
        self.n += 1
        now = time.perf_counter()
        if not self.quiet and now - self.last >= self.every_s:
            self.last = now
            print(f"  ... {self.n}/{self.total} tokens, {now - self.t0:.0f} s, "
                  f"{self.n / (now - self.t0):.2f} tokens/s", file=sys.stderr, flush=True)
        return logits

    def timing(self, n_new: int) -> tuple[str, dict]:
        """The report's time line and JSON keys: generation only (prefill included, loading not)."""
        s = time.perf_counter() - self.t0
        return (f"time       : {s:.1f} s for {n_new} new tokens, {n_new / s:.1f} tokens/s (prefill included, loading not)",
                {"elapsed_s": round(s, 3), "tokens_per_s": round(n_new / s, 3)})


def run_main(main) -> None:
    """Run a script's main(): a UserError becomes one line on stderr and exit status 2; Ctrl-C
    (KeyboardInterrupt) one line and status 130, the shell's for a process stopped by SIGINT,
    instead of a traceback through whatever the script was doing."""
    try:
        main()
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        sys.stdout.flush()
        print("interrupted (Ctrl-C)", file=sys.stderr, flush=True)
        sys.exit(130)
