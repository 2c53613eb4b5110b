"""The engine's configuration, as declared: every option, and the part each stage contributes.

    python scripts/engine_options.py             # the options table, then the assembler's table
    python scripts/engine_options.py --json      # the same, as one JSON object

Options come from each stage's ``options.py`` (one declaration each: plumbing/options.py); the
assembler's table from each stage's ``stage.py`` (the slot, and the first line of its maker's
docstring, or the stage module's table). Nothing is run: this reads the declarations.
"""
import argparse
import json

from plumbing.cli import run_main


def option_rows():
    from importlib import import_module
    from l5_scheduler.stages import stage_packages
    rows = []
    for package in stage_packages():
        for opt in import_module(f"{package}.options").OPTIONS:
            default = json.dumps(opt.default) if isinstance(opt.default, dict) else opt.default
            rows.append(dict(option=opt.name, stage=package, group=opt.group, part=opt.part, default=default,
                             flag=opt.flag if opt.type is not bool else f"{opt.flag} / --no-{opt.flag[2:]}",
                             help=opt.help))
    return rows


def part_rows():
    from l5_scheduler.stages import latest
    rows = []
    for stage in latest("stage").STAGES:
        for slot, maker in stage.parts.items():
            what = (maker.__doc__ or maker.__name__).strip().splitlines()[0]
            rows.append(dict(stage=stage.name, slot=slot, maker=f"{maker.__module__}.{getattr(maker, '__name__', '?')}",
                             doc=what))
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true", help="one JSON object instead of the tables")
    args = p.parse_args(argv)
    opts, parts = option_rows(), part_rows()
    if args.json:
        print(json.dumps(dict(options=opts, parts=parts)))
        return
    print("| option | declared in | group | part | default | flag |")
    print("|---|---|---|---|---|---|")
    for r in opts:
        print(f"| `{r['option']}` | {r['stage']}/options.py | {r['group']} | {r['part']} | {r['default']} | `{r['flag']}` |")
    print(f"\n{len(opts)} options, each declared once.\n")
    slots = list(dict.fromkeys(r["slot"] for r in parts))
    stages = list(dict.fromkeys(r["stage"] for r in parts))
    print("| slot | " + " | ".join(stages) + " |")
    print("|---|" + "---|" * len(stages))
    for slot in slots:
        cells = [next((r["doc"].split(":")[0] for r in parts if r["stage"] == s and r["slot"] == slot), "")
                 for s in stages]
        print(f"| {slot} | " + " | ".join(f"`{c}`" if c else "" for c in cells) + " |")
    print("\nA cell is the part a stage's maker makes for a slot (its docstring says when and from which options); the assembler asks the latest stage's first, and "
          "an earlier one's when it returns None (l5_scheduler/assemble.py).")


if __name__ == "__main__":
    run_main(main)
