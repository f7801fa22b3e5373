"""The learned policy replayed on a slice of the H200 measurement corpus, held out by input.

The corpus (four packs measured on an H200, see its README) lives in the shared data
folder beside the clone (``../shared/data/h200-corpus``); CI has a read-only copy there.
Each op holds out 16 inputs in two folds: a model fitted on every other input decides
them, the explored candidates get their measured times, and the commit is priced.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest.importorskip("sklearn")

from adaptive.bench.replay import replay_setups  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def _corpus() -> Path | None:
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


CORPUS = _corpus()
pytestmark = pytest.mark.skipif(CORPUS is None, reason="no ../shared/data/h200-corpus here")


def _replay(op: str):
    return replay_setups(str(CORPUS / f"h200-wide-{op}.msgpack"), (True,), folds=2,
                         held_inputs=16)[0]


@pytest.mark.parametrize("op", ["gemm", "attention"])
def test_commits_within_the_targets(op):
    report = _replay(op)
    assert len(report.cases) == 16 and all(c.op == op for c in report.cases)
    assert all(c.ratio >= 1.0 and c.explored <= 8 for c in report.cases)
    # the targets: geomean <= 1.03, >= 90 % of inputs within 5 %, worst <= 1.5x
    assert report.geomean_ratio(op) <= 1.03, str(report)
    assert report.within(1.05, op) >= 0.90, str(report)
    assert report.worst(op) <= 1.5, str(report)
    # the model alone: its first pick is within 5 % of the best on a fair share of inputs
    assert report.top1_within(1.05, op) >= 0.25, str(report)


@pytest.mark.parametrize("op", ["softmax", "spmm"])
def test_softmax_and_spmm_commit_close_to_the_best(op):
    """Not yet at the targets (whole-op replays: softmax 1.018-1.020 geomean, 88 % within
    5 %; spmm 1.027-1.041, 76-84 %, worst 1.29-1.83x depending on the ensemble's seed);
    this slice holds what is reached so that it cannot regress unseen."""
    report = _replay(op)
    assert len(report.cases) == 16
    assert report.geomean_ratio(op) <= 1.05, str(report)
    assert report.within(1.05, op) >= 0.70, str(report)
    assert report.worst(op) <= 1.5, str(report)
    assert report.top3_within(1.02, op) >= 0.4, str(report)
