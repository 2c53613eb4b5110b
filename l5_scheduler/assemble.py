"""One configuration, one assembler: the engine built from the parts the stages contribute.

Each stage from 5 on declares, in its ``stage.py``, one ``Stage``: the options it adds (its
``options.py``) and the parts it can make, by slot:

    slot         the part                          stage 5's maker (later stages add their own)
    model        the forward pass's module         the model given, or CausalLM loaded whole from a
                                                   Checkpoint (LLM's)
    kv_cache     where K/V live, and attention     stage 3's PagedKVCache
    kv_manager   the scheduler's blocks            stage 2's allocator (BlockManager)
    ops          the skeleton's small ops          its TorchOps
    runner       one forward pass per step         ModelRunner
    sampler      tokens from logits                stage 4's Sampler
    scheduler    who runs, how many tokens         Scheduler (given the kv_manager)
    step         the order of one step's work      PlainStep

One slot lives outside the engine, in a server's process, and is asked for by that server with a
``default`` maker of its own (``part(slot, default)``): the stages here make none.

    engine_client  a server's handle on its engine core process(es)

``build_engine`` builds a part when something asks for it (``Assembly.part``): of the stages
given, the latest that has a maker for the slot is asked first; a maker returns None when the
configuration is not its case (a cache for another kind of checkpoint), and the stage
before it is asked. The model comes first: the sizes (``config``, when the caller gives none) are
made for it, on its device, after it is loaded (on a GPU the pool takes the memory it leaves), and
every other maker reads it (``a.model``). The engine asks for scheduler, runner, sampler and step;
each maker asks for what its part needs (the scheduler for the kv_manager, which asks for the
kv_cache, since the cache's layout sets how many blocks the memory holds). A stage's ``LLM`` is this assembler over
the stages up to it (``entry_points``): no builder calls another.

The options of all the stages given are one configuration (``resolve_options``): an option no
stage given declares is refused in one line, which names the stage that adds it if there is one.
"""
from __future__ import annotations

import dataclasses
import difflib
import importlib
from dataclasses import dataclass, field
from typing import Callable

from pathlib import Path

import torch

from plumbing.errors import UserError
from plumbing.options import Option, Values, resolve

from .config import EngineConfig, make_config
from .engine import LLMEngine
from .stages import stage_packages


@dataclass(frozen=True)
class Stage:
    name: str                                       # its package: "l5_scheduler"
    options: tuple[Option, ...] = ()                # the options it adds
    parts: dict[str, Callable] = field(default_factory=dict)   # slot -> maker(Assembly) -> part, or None

    @property
    def number(self) -> int:
        return int(self.name[1:].split("_")[0])


@dataclass(frozen=True)
class Checkpoint:
    """A model not loaded yet: the ``model`` slot's makers load it (LLM gives this, not a model)."""
    path: Path
    device: str
    dtype: torch.dtype


SIZES = ("block_size", "num_gpu_blocks_override", "max_num_batched_tokens", "max_num_seqs", "max_model_len",
         "gpu_memory_utilization")


def engine_config(args, model, device: str, dtype) -> EngineConfig:
    """The sizes the options ask for (config.py), for this model on this device."""
    return make_config(model.cfg, device, dtype, **{k: getattr(args, k) for k in SIZES})


class Assembly:
    """What part makers read: the model (the ``model`` part), the tokenizer, the sizes (``config``;
    the KV cache's maker may change ``num_blocks``, the pool its layout holds), the options
    (``args``), and each other. ``given``: the model given to the assembler, or a Checkpoint."""

    def __init__(self, given, tokenizer, config: EngineConfig | None, args: Values, stages: tuple[Stage, ...],
                 parts: dict | None = None):
        self.given, self.tokenizer, self.args, self.stages = given, tokenizer, args, stages
        self._config = self._given_config = config     # None: made for the model part, once it is loaded
        self.parts = dict(parts or {})                 # slot -> part: built, or given by the caller (tests)
        self.chosen: dict[str, str] = {slot: "given" for slot in self.parts}    # slot -> the stage that made it
        self._settled = False

    @property
    def model(self):
        return self.part("model")

    @property
    def given_config(self) -> EngineConfig | None:
        """The sizes the caller gave, or None (a model part may read this; ``config`` needs the model)."""
        return self._given_config

    @property
    def config(self) -> EngineConfig:
        if self._config is None:
            p = next(self.model.parameters())
            self._config = engine_config(self.args, self.model, str(p.device), p.dtype)
        return self._config

    @config.setter
    def config(self, value: EngineConfig) -> None:
        self._config = value

    def part(self, slot: str, default: Callable | None = None):
        """The slot's part: made by the latest stage whose maker makes one, else by ``default(self)``
        (the maker of a caller outside the stages, for a slot no stage must fill)."""
        if slot not in self.parts:
            for stage in reversed(self.stages):
                maker = stage.parts.get(slot)
                if maker is not None and (made := maker(self)) is not None:
                    self.parts[slot], self.chosen[slot] = made, stage.name
                    break
            else:
                if default is not None:
                    self.parts[slot], self.chosen[slot] = default(self), "default"
                    return self.parts[slot]
                raise RuntimeError(f"no stage of {[s.name for s in self.stages]} makes a {slot!r} part (a bug)")
        return self.parts[slot]

    @property
    def device(self) -> torch.device:
        """Where the model is, or will be once the model part loads it."""
        g = self.given
        return torch.device(g.device) if isinstance(g, Checkpoint) else next(self.model.parameters()).device

    def pool(self):
        """The KV cache, and the sizes it settles: its layout may hold more blocks in the same memory
        (its maker changes ``config.num_blocks``), so max_model_len is checked here against what one
        request can hold of this pool (``cache.request_blocks``) and, if not given, derived from it
        (the model's context at most)."""
        cache = self.part("kv_cache")
        if not self._settled and hasattr(cache, "request_blocks"):
            self._settled, c = True, self.config
            fits = lambda n: cache.request_blocks(n, c.max_num_batched_tokens) <= c.num_blocks   # noqa: E731
            if self.args.given.get("max_model_len") is not None:
                if not fits(c.max_model_len):
                    raise UserError(f"max_model_len ({c.max_model_len}) does not fit the KV pool: one request of that "
                                    f"length holds up to {cache.request_blocks(c.max_model_len, c.max_num_batched_tokens)} "
                                    f"blocks, the pool has {c.num_blocks}. Raise num_gpu_blocks_override or lower "
                                    "max_model_len (or max_num_batched_tokens, which bounds a windowed layer's chunk).")
            else:
                lo, hi = 0, self.model.cfg.max_position_embeddings          # the longest request that fits
                while lo < hi:
                    mid = (lo + hi + 1) // 2
                    lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
                if lo < 1:
                    raise UserError(f"the KV pool ({c.num_blocks} blocks of {c.block_size} tokens) cannot hold one "
                                    "request: raise num_gpu_blocks_override.")
                self.config = dataclasses.replace(c, max_model_len=lo)
        return cache


def declared(stages) -> dict[str, Option]:
    """Every option of these stages, by name; one declared twice is a bug, caught at import."""
    out: dict[str, Option] = {}
    for stage in stages:
        for opt in stage.options:
            if opt.name in out:
                raise RuntimeError(f"option {opt.name!r} is declared twice (again by {stage.name})")
            out[opt.name] = opt
    return out


def later_stage_hint(stages) -> Callable[[str], str]:
    """Which later stage declares an option, or one spelled like it when this engine has none so
    spelled (stages.py finds them by folder, light: no torch)."""
    def hint(name: str) -> str:
        later = {o.name: (number, package) for number, package in
                 ((int(p[1:].split("_")[0]), p) for p in stage_packages()) if number > stages[-1].number
                 for o in importlib.import_module(f"{package}.options").OPTIONS}
        close = difflib.get_close_matches(name, later, n=1)
        if name in later or (close and not difflib.get_close_matches(name, declared(stages), n=1)):
            meant = name if name in later else close[0]
            number, package = later[meant]
            return (("" if meant == name else f"did you mean {meant!r}? ") + f"it is an option of stage {number} "
                    f"({package}), which {stages[-1].name} comes before: use `from {package} import LLM`")
        return ""
    return hint


def resolve_options(stages, given: dict) -> Values:
    """The configuration: every given option checked against its one declaration, defaults for the rest."""
    return resolve(declared(stages), given, later_stage_hint(stages))


def build_engine(model, tokenizer, config, stages, *, args: Values | None = None, parts: dict | None = None,
                 wrap=None, **options) -> LLMEngine:
    """The one engine for ``model`` (loaded, or a Checkpoint the model slot loads), ``config`` (the
    sizes: config.py; None: made for the model) and the options (``args``, or checked here from
    ``options``). ``parts``: a slot's part given outright (tests give plain oracles);
    ``wrap(name, part)`` may wrap the scheduler, runner and sampler (a profiler times them so)."""
    args = args if args is not None else resolve_options(stages, options)
    a = Assembly(model, tokenizer, config, args, stages, parts)
    if args.impl == "auto":                          # the interpreter is too slow to serve from
        args.impl = "triton" if a.device.type == "cuda" else "torch"
    a.pool()
    got = {slot: a.part(slot) for slot in ("scheduler", "runner", "sampler")}
    if wrap is not None:
        got = {slot: wrap(slot, part) for slot, part in got.items()}
    engine = LLMEngine(a.model, tokenizer, a.config, **got, step=a.part("step"),
                       keep_logits=args.keep_logits)
    engine.args, engine.chosen = args, a.chosen        # what it was built from: the options, each part's stage
    return engine
