"""The ``adaptive`` command: one sub-command per module, imported only when used."""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

HELP = ("adaptive: runtime adaptive GPU kernel dispatch. Run 'adaptive COMMAND --help' for a "
        "command's options.")

# sub-command -> module defining add_arguments(parser) and run(args) -> int
COMMANDS = {
    "bench": ("adaptive.bench.cli", "run the benchmarks: selection, hot-path overhead and "
                                "mixed workload (the main job)"),
    "explain": ("adaptive.policy.explain_cli", "show the ranked candidates for one input and why "
                                        "one is chosen"),
    "pack": ("adaptive.packs.cli", "build, show, diff and merge variant packs"),
    "log": ("adaptive.counterlog.cli", "summarise, plot and export counter logs"),
    "regen": ("adaptive.regen.cli", "run one regeneration loop for an input class"),
    "verify": ("adaptive.regen.verify_cli", "verify a variant source file"),
    "nvrtc-check": ("adaptive.nvrtc", "compile every CUDA variant x config for a GPU arch"),
    "env": ("adaptive.envinfo", "show configuration, backends and devices"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="adaptive", description=HELP)
    parser.add_argument("-V", "--version", action="store_true",
                        help="print the version and where the package is installed")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, add_help=False)
        p.set_defaults(_module=module)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    if not argv or argv[0] in ("-h", "--help"):
        parser.print_help()
        return 0
    if argv[0] in ("-V", "--version"):
        import adaptive
        print(f"adaptive-dispatch {adaptive.__version__} (import name adaptive, at "
              f"{Path(adaptive.__file__).parent})")
        return 0
    name = argv[0]
    if name not in COMMANDS:
        from adaptive.errors import UnknownNameError
        parser.error(str(UnknownNameError("command", name, COMMANDS)))
    try:
        module = importlib.import_module(COMMANDS[name][0])
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.startswith("adaptive"):
            print(f"adaptive {name}: not available in this build ({exc.name} missing)",
                  file=sys.stderr)
            return 2
        raise
    sub = argparse.ArgumentParser(prog=f"adaptive {name}", description=COMMANDS[name][1])
    module.add_arguments(sub)
    args = sub.parse_args(argv[1:])
    from adaptive.errors import AdaptiveError
    try:
        return int(module.run(args) or 0)
    except BrokenPipeError:   # output piped into `head` and closed: not an error
        sys.stderr.close()
        return 0
    except AdaptiveError as exc:   # bad input or an unavailable backend: one line, no trace
        print(f"adaptive {name}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
