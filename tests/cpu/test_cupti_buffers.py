"""CUPTI's buffers taken through ctypes (profilers/cupti_buffers.py) on a fake libcupti:
records parsed at the binding's offsets, record sizes checked against CUPTI's own walk and
learned where they differ, a kind of unknown size walked by CUPTI, kernel names read
once, buffers reused, CUPTI's refusal named. The join of records to calls runs through
both deliveries in test_counterlog_cupti.py (its ``fake`` fixture)."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_counterlog_cupti import CtypesFakeCupti  # noqa: E402

from profilers.cupti import CuptiActivity  # noqa: E402


def _activity(cupti, names=True):
    return CuptiActivity(cupti=cupti, lib=cupti.lib, names=names)


def _launches(cupti, act, n, t0=1_000, name="softmax_reg"):
    spans = []
    for i in range(n):
        ext = act.push(("op", i))
        start = t0 + 10_000 * i
        cupti.launch(name, start, start + 700 + i)
        act.pop()
        spans.append((ext, start, start + 700 + i))
    return spans


def test_records_parse_at_the_bindings_offsets_and_join_their_tags():
    cupti = CtypesFakeCupti()
    act = _activity(cupti)
    assert act.status == "ok" and act._buffers is not None
    spans = _launches(cupti, act, 5)
    cupti.deliver()
    got = act.harvest()
    assert [(r.tag, r.start_ns, r.end_ns, r.name) for r in got] == [
        (("op", i), s, e, "softmax_reg") for i, (_, s, e) in enumerate(spans)]
    b = act._buffers
    # the first buffers are walked by CUPTI too: the sizes agreed, nothing was learned
    assert b.mismatch is None and b.checked == 1 and b.slow_buffers == 1
    assert act.narrowed     # one API record a launch (the launch call), counted as other
    assert act.counts["buffers"] == 1 and act.counts["other"] == 5


def test_record_sizes_cupti_walks_differently_are_learned_once():
    cupti = CtypesFakeCupti(sizes={10: 232, 19: 24, 5: 48, 6: 48})   # a newer record version
    act = _activity(cupti, names=False)
    spans = _launches(cupti, act, 4)
    cupti.deliver()
    first = act.harvest()
    spans += _launches(cupti, act, 3, t0=900_000)
    cupti.deliver()
    spans += _launches(cupti, act, 3, t0=2_000_000)
    cupti.deliver()
    got = first + act.harvest()
    assert [(r.start_ns, r.end_ns) for r in got] == [(s, e) for _, s, e in spans]
    b = act._buffers
    assert "differ from the binding's" in b.mismatch
    assert b.layout.sizes[10] == 232 and b.layout.sizes[5] == 48
    assert b.slow_buffers == 2                # the two checked buffers; the third walked fast


def test_a_buffer_with_a_kind_of_unknown_size_is_walked_by_cupti():
    cupti = CtypesFakeCupti(sizes={10: 200, 19: 24, 5: 40, 6: 40, 3: 64})
    act = _activity(cupti, names=False)
    spans = _launches(cupti, act, 2)
    cupti.deliver()
    act.harvest()                              # the checked buffers are spent
    act._buffers.checked = 99
    slow = act._buffers.slow_buffers
    spans = _launches(cupti, act, 2, t0=500_000)
    cupti.pending.insert(1, types.SimpleNamespace(kind=3, correlation_id=7, start=1, end=2))
    cupti.deliver()
    got = act.harvest()
    assert [(r.start_ns, r.end_ns) for r in got] == [(s, e) for _, s, e in spans]
    assert act._buffers.slow_buffers == slow + 1
    assert act.counts["other"] == 2 + 2 + 1     # one API record a launch, the unknown one


def test_buffers_are_handed_back_and_reused():
    cupti = CtypesFakeCupti()
    act = _activity(cupti, names=False)
    for round_ in range(6):
        _launches(cupti, act, 3, t0=round_ * 100_000)
        cupti.deliver()
    assert len(act.harvest()) == 18
    b = act._buffers
    assert len(b._pool) == 1 and b.buffers == 6 and b.callback_cpu_s >= 0.0


def test_kernel_names_are_read_once_a_kernel():
    cupti = CtypesFakeCupti()
    act = _activity(cupti)
    _launches(cupti, act, 3, name="gemm_tc")
    _launches(cupti, act, 2, t0=90_000, name="softmax_warp")
    cupti.deliver()
    assert [r.name for r in act.harvest()] == ["gemm_tc"] * 3 + ["softmax_warp"] * 2
    assert sorted(act._buffers._names.values()) == ["gemm_tc", "softmax_warp"]


@pytest.mark.parametrize("rc, expected", [(39, "held by another tool"),
                                          (1, "CUPTI refused: RuntimeError")])
def test_cupti_refusing_the_callbacks_is_named(rc, expected, caplog):
    cupti = CtypesFakeCupti(refuse=rc)
    caplog.set_level("WARNING")
    act = _activity(cupti)
    assert expected in act.status and "cuptiActivityRegisterCallbacks" in act.status
    assert act._cupti is None and act.push("x") == 0 and act.harvest() == []
