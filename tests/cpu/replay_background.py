"""The replays of the learned policy that test_replay.py and test_replay_corpus.py check,
run once as a background job (``tests/background.py``) instead of in the session's process.

A replay is scikit-learn fits on a pack's measurements, with no clock in it (the times are
the pack's): 11-12 s of CPU that every later test waited behind when the session's process
ran it, and that a job at nice 19 runs on what the rest of the suite leaves idle. The
reports come back as JSON (``dataclasses.asdict`` of each ``ReplayReport``) and are rebuilt
into the same dataclasses, so the tests' assertions read what they read before.
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

from background import Job

ROOT = Path(__file__).resolve().parents[2]
OUT = "replays.json"

# the held-out replays of the shipped H200 pack's attention rows (test_replay's fixture):
# its attention and softmax rows as a pack of their own, each set-up (no anchors, anchors)
SMALL_OPS = ("attention", "softmax")


def corpus() -> Path | None:
    """``../shared/data/h200-corpus`` beside the clone; for a git worktree, beside the
    main clone it belongs to."""
    roots = [ROOT.parent]
    dot_git = ROOT / ".git"
    if dot_git.is_file():   # a worktree: "gitdir: <main>/.git/worktrees/<name>"
        m = re.match(r"gitdir:\s*(.+)", dot_git.read_text())
        if m:
            roots.append(Path(m.group(1).strip()).parents[2].parent)
    for root in roots:
        here = root / "shared" / "data" / "h200-corpus"
        if (here / "h200-wide-spmm.msgpack").is_file():
            return here
    return None


def h200_pack() -> str | None:
    """The shipped H200 pack's path, or None in a checkout without one."""
    from adaptive.packs import shipped_packs
    return next((str(p) for p in shipped_packs() if "h200" in p.name), None)


def write_small_pack(pack, path: Path) -> str:
    """``pack``'s SMALL_OPS variants and rows (no cubins) as a pack of their own at ``path``
    (a replay fits its model on every row of a pack; these replays check its bookkeeping,
    not the whole pack's model)."""
    from adaptive.packs.format import new_pack, write_pack
    write_pack(new_pack([v for v in pack.variants if v.op in SMALL_OPS],
                        [r for r in pack.rows if r.op in SMALL_OPS], pack.fingerprint), path)
    return str(path)


def _calls() -> list[dict]:
    """Each replay to run: its name, the pack ("small": the small pack of the H200 pack),
    replay_setups' set-ups and keyword arguments."""
    calls = []
    here = corpus()
    if here is not None:
        calls += [{"name": f"corpus-{op}", "pack": str(here / f"h200-wide-{op}.msgpack"),
                   "setups": [True], "kwargs": {"folds": 2, "held_inputs": 16}}
                  for op in ("gemm", "attention", "spmm", "softmax")]
        calls.append({"name": "anchors", "pack": str(here / "h200-wide-attention.msgpack"),
                      "setups": [False, True], "kwargs": {"ops": ["attention"], "folds": 10}})
    if h200_pack() is not None:
        calls.append({"name": "small-attention", "pack": "small", "setups": [False, True],
                      "kwargs": {"ops": ["attention"], "folds": 2}})
    return calls


# in a fresh process: sys.argv[1] this folder and tests/ (for this module and the
# background one it imports), [2] the job's folder, [3] the calls as JSON; writes {name:
# [asdict of each set-up's report]} to OUT
_RUN = r"""
import dataclasses, json, sys
from pathlib import Path
sys.path[:0] = sys.argv[1].split("|")
import replay_background as rb
from adaptive.bench.replay import replay_setups
folder, out = Path(sys.argv[2]), {}
for call in json.loads(sys.argv[3]):
    pack = call["pack"]
    if pack == "small":
        from adaptive.packs.format import read_pack
        pack = rb.write_small_pack(read_pack(rb.h200_pack()), folder / "small.msgpack")
    reports = replay_setups(pack, call["setups"], **call["kwargs"])
    out[call["name"]] = [dataclasses.asdict(r) for r in reports]
(folder / rb.OUT).write_text(json.dumps(out))
"""


def _args(folder: Path, config) -> list[str]:
    here = Path(__file__).resolve().parent
    return ["-c", _RUN, f"{here}|{here.parent}", str(folder), json.dumps(_calls())]


# the BACKGROUND entry of both test modules (one job: started once, read by both)
BACKGROUND = {"replays": Job(_args, cpu_s=14.0, nice=19, timeout_s=600)} \
    if importlib.util.find_spec("sklearn") else {}


def reports(background, name: str) -> list:
    """The ReplayReport of each set-up of the replay ``name``, as the job computed them."""
    from adaptive.bench.replay import Case, ReplayReport
    done = background("replays")
    path = done.folder / OUT
    assert done.rc == 0 and path.exists(), done.report()
    return [ReplayReport(**{**r, "cases": tuple(Case(**c) for c in r["cases"])})
            for r in json.loads(path.read_text())[name]]
