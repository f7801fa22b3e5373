"""``adaptive env``: the configuration in force, the backends and the variant library."""

from __future__ import annotations

import argparse
import json


def collect() -> dict:
    from adaptive import config
    from adaptive.backends import gpu_available, resolve_name
    from adaptive.variants import shared_registry
    registry = shared_registry()
    info = {
        "config": {k: ("<set>" if "key" in k and getattr(config.get(), k) else
                       getattr(config.get(), k)) for k in config.Config.__dataclass_fields__},
        "gpu_available": gpu_available(),
        "default_backend": resolve_name(config.get().backend),
        # experimental variants (never candidates; run where named) marked as such
        "variants": {op: sorted(f"{v.name} ({v.backend}{', experimental' * v.experimental})"
                                for v in registry.variants(op, experimental=True))
                     for op in registry.ops()},
    }
    return info


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON")


def run(args) -> int:
    info = collect()
    if args.json:
        print(json.dumps(info, indent=2, default=str))
        return 0
    from adaptive import config
    print(config.describe())
    print(f"\ngpu available: {info['gpu_available']}; default backend: "
          f"{info['default_backend']}")
    for op, names in info["variants"].items():
        print(f"{op}: {', '.join(names)}")
    return 0
