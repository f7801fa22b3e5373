"""The counter log's CUPTI timing source, on a fake CUPTI: each logged call gets the GPU
span of the kernels it issued (joined by external correlation id), calls are sampled one
in N, kernels that never come are counted, "auto" is event pairs and "cupti" falls back to
them where CUPTI refuses. The logs here are not governed (the governor's handover is in
test_counterlog_governor.py): it would judge the fake's costs by this machine's clock."""

from __future__ import annotations

import ctypes
import dataclasses
import enum
import sys
import types

import numpy as np
import pytest

from adaptive.counterlog import CounterLog, read_log, recorders
from adaptive.dispatch import Dispatcher
from adaptive.ops import get_op
from adaptive.policy import MeasureEach
from profilers import cupti as cupti_mod
from profilers.cupti import CuptiActivity, CuptiTimer


class FakeCupti:
    """The cupti.cupti surface used; kernels are 'launched' by the test, delivered on flush.

    Like CUPTI, an external-correlation record is written only beside an API record: a
    launch inside a pushed id yields one when DRIVER or RUNTIME activity is enabled, and
    none otherwise (the kernel then carries no id: what the H200 showed). Each launch
    also makes a context query first (``cuCtxGetCurrent``, as CuPy does), which has its
    own API record and id record unless the API records are narrowed to launches."""

    class ActivityKind:
        DRIVER, RUNTIME, CONCURRENT_KERNEL, EXTERNAL_CORRELATION = 5, 6, 10, 19

    class ExternalCorrelationKind:
        CUSTOM0 = 4

    driver_api_trace_cbid = enum.IntEnum("driver_api_trace_cbid", {
        "INVALID": 0, "cuCtxGetCurrent": 1, "cuMemAlloc_v2": 2, "cuLaunchKernel": 3,
        "cuLaunchKernelEx": 4, "cuLaunchHostFunc": 5, "SIZE": 6})
    runtime_api_trace_cbid = enum.IntEnum("runtime_api_trace_cbid", {
        "INVALID": 0, "cudaGetDevice_v3020": 1, "cudaLaunchKernel_v7000": 2, "SIZE": 3})

    def __init__(self):
        self.stack, self.pending, self.correlation, self.pushes = [], [], 100, 0
        self.enabled = set()
        self.api_off = set()                              # (driver?, cbid) switched off

    def activity_register_callbacks(self, requested, completed):
        self.requested, self.completed = requested, completed

    def activity_enable(self, kind):
        self.enabled.add(kind)

    def activity_disable(self, kind):
        self.enabled.discard(kind)

    def activity_enable_driver_api(self, cbid, enable):
        (self.api_off.discard if enable else self.api_off.add)(("driver", cbid))

    def activity_enable_runtime_api(self, cbid, enable):
        (self.api_off.discard if enable else self.api_off.add)(("runtime", cbid))

    def activity_push_external_correlation_id(self, kind, ext):
        assert kind == 4
        self.pushes += 1
        self.stack.append(ext)

    def activity_pop_external_correlation_id(self, kind):
        return self.stack.pop()

    def _api(self, cbid: int, start_ns: int) -> None:
        """One driver API call: its API record, and an id record inside a push."""
        self.correlation += 1
        if 5 not in self.enabled or ("driver", cbid) in self.api_off:
            return
        if self.stack and 19 in self.enabled:
            self.pending.append(types.SimpleNamespace(
                kind=19, correlation_id=self.correlation, external_id=self.stack[-1]))
        self.pending.append(types.SimpleNamespace(kind=5, correlation_id=self.correlation,
                                                  start=start_ns - 3000, end=start_ns - 1000))

    def launch(self, name, start_ns, end_ns, cbid: int = 3):
        self._api(1, start_ns)                            # cuCtxGetCurrent: no kernel
        self._api(cbid, start_ns)                         # cuLaunchKernel (default)
        self.pending.append(types.SimpleNamespace(kind=10, correlation_id=self.correlation,
                                                  name=name, start=start_ns, end=end_ns))

    def deliver(self, keep_last: int = 0):
        """Hand over the records, all but the last ``keep_last`` (a later buffer)."""
        cut = len(self.pending) - keep_last
        records, self.pending = self.pending[:cut], self.pending[cut:]
        self.completed(records)

    held_until_forced = False                     # a buffer a default flush leaves

    def activity_flush_all(self, flag):
        if flag == 1 and self.held_until_forced and self.pending:
            self.deliver()                            # else the test delivers explicitly


# CUPTI's record layouts as the binding's dtypes give them (cupti-python 13): the fields
# the reader reads, at offsets like the C structs'; the ctypes fake writes these bytes
KERNEL_DTYPE = np.dtype({"names": ["kind", "start", "end", "correlation_id", "name"],
                         "formats": ["<u4", "<u8", "<u8", "<u4", "<u8"],
                         "offsets": [0, 16, 24, 36, 48], "itemsize": 196})
EXTERNAL_DTYPE = np.dtype({"names": ["kind", "external_kind", "external_id",
                                     "correlation_id"],
                           "formats": ["<u4", "<u4", "<u8", "<u4"],
                           "offsets": [0, 4, 8, 16], "itemsize": 24})
API_DTYPE = np.dtype({"names": ["kind", "cbid", "start", "end", "correlation_id"],
                      "formats": ["<u4", "<u4", "<u8", "<u8", "<u4"],
                      "offsets": [0, 4, 8, 16, 32], "itemsize": 40})


class FakeLib:
    """libcupti's three functions the ctypes buffers call, over a fake's buffers: the
    callbacks registered, ``cuptiActivityGetNextRecord`` walking records by the sizes
    the fake wrote them with, ``cuptiGetResultString``."""

    _NEXT = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t,
                             ctypes.POINTER(ctypes.c_void_p))
    _RESULT = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_char_p))

    def __init__(self, sizes: dict, refuse: int = 0):
        self.sizes, self.refuse = sizes, refuse          # kind -> bytes the fake writes
        self.cuptiActivityGetNextRecord = self._NEXT(self._next)
        self.cuptiGetResultString = self._RESULT(self._result)
        self._names = {}
        self.requested = self.completed = None

    def cuptiActivityRegisterCallbacks(self, requested, completed):
        if self.refuse:
            return self.refuse
        self.requested, self.completed = requested, completed
        return 0

    def _next(self, buf, valid, rec):
        cur = rec[0]
        nxt = buf if cur is None else cur + self.sizes[ctypes.c_uint32.from_address(cur).value]
        if nxt >= buf + valid:
            return 10                                   # CUPTI_ERROR_MAX_LIMIT_REACHED
        rec[0] = nxt
        return 0

    def _result(self, rc, text):
        name = self._names.setdefault(rc, ctypes.create_string_buffer(
            b"CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED" if rc == 39 else b"CUPTI_ERROR"))
        text[0] = ctypes.cast(name, ctypes.c_char_p)
        return 0


class CtypesFakeCupti(FakeCupti):
    """The same fake, its buffers handed over as CUPTI does to callbacks registered on
    libcupti: raw records written at their offsets into a buffer the reader asked for.
    ``sizes``: the bytes it writes each kind's record in (default: the dtypes')."""

    activity_kernel10_dtype = KERNEL_DTYPE
    activity_external_correlation_dtype = EXTERNAL_DTYPE
    activity_api_dtype = API_DTYPE

    def __init__(self, sizes: dict | None = None, refuse: int = 0):
        super().__init__()
        self.sizes = sizes or {10: 200, 19: 24, 5: 40, 6: 40}
        self.lib = FakeLib(self.sizes, refuse)
        self.names = {}                                 # kernel name -> its C string

    def activity_register_callbacks(self, requested, completed):
        raise AssertionError("the ctypes path registers on libcupti, not the binding")

    def _name_ptr(self, name: str) -> int:
        buf = self.names.setdefault(name, ctypes.create_string_buffer(name.encode()))
        return ctypes.addressof(buf)

    def deliver(self, keep_last: int = 0):
        cut = len(self.pending) - keep_last
        records, self.pending = self.pending[:cut], self.pending[cut:]
        buf, size, most = ctypes.c_void_p(), ctypes.c_size_t(), ctypes.c_size_t()
        self.lib.requested(ctypes.byref(buf), ctypes.byref(size), ctypes.byref(most))
        data = bytearray()
        for r in records:
            rec = bytearray(self.sizes[r.kind])
            rec[0:4] = r.kind.to_bytes(4, "little")
            if r.kind == 10:
                dt, vals = KERNEL_DTYPE, {"start": r.start, "end": r.end,
                                          "correlation_id": r.correlation_id,
                                          "name": self._name_ptr(r.name)}
            elif r.kind == 19:
                dt, vals = EXTERNAL_DTYPE, {"external_id": r.external_id,
                                            "correlation_id": r.correlation_id}
            else:
                dt, vals = API_DTYPE, {"start": r.start, "end": r.end,
                                       "correlation_id": r.correlation_id}
            for field, value in vals.items():
                fmt, off = dt.fields[field][:2]
                bits = int(value) & ((1 << 8 * fmt.itemsize) - 1)   # as C stores it
                rec[off:off + fmt.itemsize] = bits.to_bytes(fmt.itemsize, "little")
            data += rec
        assert len(data) <= size.value
        ctypes.memmove(buf.value, bytes(data), len(data))
        self.lib.completed(None, 0, buf, size, len(data))


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


@pytest.fixture(params=["binding", "ctypes"])
def fake(monkeypatch, request):
    """A fake CUPTI handing its buffers over through the binding's callbacks or, as the
    real one does here, through callbacks registered on libcupti with ctypes."""
    return _fake(monkeypatch, request.param)


@pytest.fixture
def binding_fake(monkeypatch):
    return _fake(monkeypatch, "binding")


def _fake(monkeypatch, delivery: str):
    current = types.SimpleNamespace(ptr=0x7700)
    cuda = types.SimpleNamespace(get_current_stream=lambda: current)
    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(cuda=cuda))
    cupti = FakeCupti() if delivery == "binding" else CtypesFakeCupti()
    clock = Clock()
    activity = CuptiActivity(cupti=cupti, lib=getattr(cupti, "lib", None))
    timer = CuptiTimer(64, activity=activity, settle_s=0.5, clock=clock).use_cupy_streams()
    assert timer.status == "ok"
    return cupti, timer, clock, current


@pytest.fixture
def host():
    d = Dispatcher("host", policy=MeasureEach())
    d.sample_every = 0
    return d


def before_run(d, op, args, before):
    """Make the plan of ``op`` call ``before()`` first on each call (after one undisturbed
    launch that decides)."""
    d.launch(op, *args)                                   # decided before the log
    plan = d._plans[get_op(op).key(args, {})]
    run = plan.run

    def run_after(a, out):
        before()
        return run(a, out)
    d._plans[plan.key] = dataclasses.replace(plan, run=run_after)


def kernels_in_run(d, op, args, cupti, spans):
    """Make the plan of ``op`` issue fake kernels: ``spans[0]`` is popped per call, a list
    of (start_ns, end_ns)."""
    def issue():
        for i, (start, end) in enumerate(spans.pop(0)):
            cupti.launch(f"{op}_k{i}", start, end)
    before_run(d, op, args, issue)


def attach(clog, d, timer):
    clog._timers[0] = timer
    rec = recorders.LogRecorder(clog, d, timer)
    clog._recorders[d] = rec
    d.add_recorder(rec)
    return rec


def test_each_logged_call_gets_the_gpu_span_of_its_kernels(tmp_path, rng, fake, host):
    cupti, timer, clock, current = fake
    x = rng.standard_normal((11, 29)).astype(np.float32)
    starts = np.cumsum(rng.integers(50_000, 90_000, size=5))
    spans = [[(int(s), int(s) + 20_000 + 1000 * i)] for i, s in enumerate(starts)]
    spans[2] = [(int(starts[2]), int(starts[2]) + 7_000),          # two kernels in one call
                (int(starts[2]) + 9_000, int(starts[2]) + 30_000)]
    expected_ms = [(s[-1][1] - s[0][0]) / 1e6 for s in spans]
    kernels_in_run(host, "softmax", (x,), cupti, list(spans))
    cupti.launch("someone_elses", 1, 2)                           # untagged: ignored
    clog = CounterLog(tmp_path / "cupti.alog", sample_every=1, flush_interval_s=60.0,
                      govern=False, nvml=False).open()
    rec = attach(clog, host, timer)
    assert isinstance(rec, recorders.CuptiLogRecorder)
    for i in range(5):
        current.ptr = 0x7700 + i % 2
        y = host.launch("softmax", x)
        assert np.abs(y - get_op("softmax").reference(x)).max() < 1e-5
    assert cupti.pushes == 5 and cupti.stack == []
    cupti.deliver()
    clog._drain()
    assert clog.stats.written == 4 and timer.pending == 1   # the last waits for settling
    clock.now += 1.0
    clog._drain()
    stats = clog.close()
    assert stats.written == 5 and stats.dropped == 0
    recs = read_log(tmp_path / "cupti.alog").records
    assert [r["time_ms"] for r in recs] == pytest.approx(expected_ms, rel=1e-12)
    assert {r["timer"] for r in recs} == {"cupti"}
    assert [r["stream"] for r in recs] == [0x7700 + i % 2 for i in range(5)]


def test_a_call_waits_for_kernels_in_a_later_buffer(tmp_path, rng, fake, host):
    cupti, timer, clock, _ = fake
    x = rng.standard_normal((4, 9)).astype(np.float32)
    kernels_in_run(host, "softmax", (x,), cupti, [[(0, 5_000), (6_000, 11_000)]])
    clog = CounterLog(tmp_path / "late.alog", sample_every=1, flush_interval_s=60.0,
                      govern=False, nvml=False).open()
    attach(clog, host, timer)
    host.launch("softmax", x)
    cupti.deliver(keep_last=2)                 # the second kernel (and its id) comes later
    clog._drain()
    assert clog.stats.written == 0             # not settled, no later call: not cut short
    cupti.deliver()
    clock.now += 1.0
    clog._drain()
    clog.close(wait_gpu_s=0.0)   # the last call waits for a later one: the closing harvest
    (rec,) = read_log(tmp_path / "late.alog").records
    assert rec["time_ms"] == pytest.approx(0.011)


def test_calls_whose_kernels_never_come_are_dropped_and_counted(tmp_path, rng, fake, host):
    cupti, timer, clock, _ = fake
    x = rng.standard_normal((4, 9)).astype(np.float32)
    kernels_in_run(host, "softmax", (x,), cupti, [[], [], [(0, 4_000)]])
    clog = CounterLog(tmp_path / "none.alog", sample_every=1, flush_interval_s=60.0,
                      govern=False, nvml=False).open()
    attach(clog, host, timer)
    for _ in range(3):
        host.launch("softmax", x)              # two calls without kernels, then one
    cupti.deliver()
    clog._drain()                              # seen; then past lost_after_s
    clock.now += 10.0
    clog._drain()
    stats = clog.close()
    assert stats.written == 1 and stats.dropped == 2


def test_one_call_in_n_is_tagged(tmp_path, rng, fake, host):
    cupti, timer, clock, _ = fake
    x = rng.standard_normal((4, 9)).astype(np.float32)
    kernels_in_run(host, "softmax", (x,), cupti,
                   [[(1000 * i, 1000 * i + 500)] for i in range(12)])
    clog = CounterLog(tmp_path / "every.alog", sample_every=4, flush_interval_s=60.0,
                      govern=False, nvml=False).open()
    attach(clog, host, timer)
    for _ in range(12):
        host.launch("softmax", x)
    assert cupti.pushes == 3
    cupti.deliver()
    clog._drain()
    clock.now += 1.0
    clog._drain()
    clog.close()
    contents = read_log(tmp_path / "every.alog")
    assert [r["time_ms"] for r in contents.records] == pytest.approx([0.0005] * 3)
    assert contents.headers[0]["sample_every"] == 4


def test_auto_timing_is_event_pairs_and_cupti_falls_back_to_them(tmp_path, monkeypatch,
                                                                  caplog):
    asked = []
    monkeypatch.setattr(cupti_mod, "shared_activity",
                        lambda cupti=None: asked.append(1) or CuptiActivity(cupti=_Refusing()))
    made = []
    monkeypatch.setattr("profilers.events.EventTimer",
                        lambda capacity, index: made.append((capacity, index)) or "events")
    auto = CounterLog(tmp_path / "a.alog", timing="auto", nvml=False, event_capacity=32)
    assert auto._make_timer(0) == "events" and auto.timings == {0: "cuda_event"}
    assert not asked                              # auto never starts CUPTI
    strict = CounterLog(tmp_path / "b.alog", timing="cupti", nvml=False, govern=False)
    caplog.set_level("WARNING")
    assert strict._make_timer(0) == "events"
    assert any("CUPTI timing asked for" in r.message for r in caplog.records)
    assert made == [(32, 0), (4096, 0)] and asked == [1]
    # governed: event pairs while the launch rate is probed, CUPTI not even asked
    probing = CounterLog(tmp_path / "p.alog", timing="cupti", nvml=False)
    assert probing._make_timer(0) == "events" and probing.timings == {0: "cuda_event"}
    assert asked == [1] and probing.governor.state.cupti == "probe"
    with pytest.raises(ValueError, match="timing must be one of auto, cupti, events"):
        CounterLog(tmp_path / "c.alog", timing="nsight")


def _finalizing(delivery: str, refuse: bool = False):
    """A fake CUPTI (either delivery) that can be detached as CUPTI wants it done: a
    subscriber's callback runs at the enter and exit of each API call the test makes
    (``api_call``), and ``finalize`` drops the callbacks, the subscriber and every enabled
    kind (``refuse``: subscribing fails, as with another tool's subscriber);
    ``registered`` counts the buffer callbacks' registrations."""
    base = FakeCupti if delivery == "binding" else CtypesFakeCupti

    class Finalizing(base):
        ApiCallbackSite = enum.IntEnum("ApiCallbackSite", {"API_ENTER": 0, "API_EXIT": 1})
        CallbackDomain = enum.IntEnum("CallbackDomain", {"DRIVER_API": 1, "RUNTIME_API": 2})

        def __init__(self):
            super().__init__()
            self.registered, self.finalized, self.subscriber = 0, 0, None
            self.domains, self.finalized_in = set(), None
            lib = getattr(self, "lib", None)
            if lib is not None:
                register = lib.cuptiActivityRegisterCallbacks

                def counted(requested, completed):
                    self.registered += 1
                    return register(requested, completed)
                lib.cuptiActivityRegisterCallbacks = counted

        def activity_register_callbacks(self, requested, completed):
            self.registered += 1
            super().activity_register_callbacks(requested, completed)

        def subscribe(self, callback, userdata):
            if refuse:
                raise RuntimeError("CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED")
            assert self.subscriber is None, "one subscriber a process"
            self.subscriber = callback
            return 77

        def enable_domain(self, enable, subscriber, domain):
            assert subscriber == 77 and enable == 1
            self.domains.add(domain)

        def unsubscribe(self, subscriber):
            self.subscriber = None

        def api_call(self):
            """One CUDA API call: the subscriber's callback at its enter and exit."""
            for site in (0, 1):
                if self.subscriber is not None and self.domains:
                    self.in_callback = site
                    self.subscriber(None, 1, 3, types.SimpleNamespace(callback_site=site))
                    self.in_callback = None

        def finalize(self):
            self.finalized += 1
            self.finalized_in = getattr(self, "in_callback", None)
            self.enabled.clear()
            self.subscriber, self.domains = None, set()
            target = getattr(self, "lib", self)
            target.requested = target.completed = None
    return Finalizing()


@pytest.mark.parametrize("delivery", ["binding", "ctypes"])
def test_a_handed_over_timer_detaches_cupti_and_a_new_user_attaches_it_again(monkeypatch,
                                                                              delivery):
    """When every user of the shared activity has let it stop (a counter log's retired
    CUPTI timer once its calls are in), CUPTI is detached from the process, not only
    paused: attached, it kept costing every launch (runs S6, S7). What it recorded is
    still harvested; a user that needs it again attaches it anew."""
    current = types.SimpleNamespace(ptr=0x7700)
    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(cuda=types.SimpleNamespace(
        get_current_stream=lambda: current)))
    fake = _finalizing(delivery)
    fake.held_until_forced = True       # the records come with the detach's forced flush
    monkeypatch.setattr(cupti_mod, "_shared", None)
    monkeypatch.setattr(cupti_mod, "_shared_users", 0)
    monkeypatch.setattr(cupti_mod, "CuptiActivity",
                        lambda cupti=None: CuptiActivity(cupti=fake,
                                                         lib=getattr(fake, "lib", False)))
    timer = CuptiTimer(8)
    activity = timer.activity
    assert fake.registered == 1 and fake.enabled == {5, 6, 10, 19}
    ext = next(timer.ids)
    timer.push_id(ext)
    fake.launch("k", 1000, 3000)
    timer.pop_id()
    timer.append_pending((ext, "entry"))
    timer.set_recording(False)          # the governor's retirement: nothing pending
    assert activity.status == "detaching" and fake.finalized == 0 and fake.enabled == set()
    fake.api_call()                     # the next CUDA call's exit: CUPTI's safe place
    assert activity.status == "detached" and fake.finalized == 1 and fake.finalized_in == 1
    fake.api_call()
    assert fake.finalized == 1
    flushes = activity.flushes
    assert [e for e, _ in timer.harvest_entries()] == [(ext, "entry")]
    assert activity.flushes == flushes  # detached: CUPTI is not called (it would attach)
    timer.set_recording(True)           # needed again: attached anew
    assert activity.status == "ok" and fake.registered == 2 and fake.enabled == {5, 6, 10, 19}
    timer.close()


def test_cupti_stays_attached_and_paused_when_it_cannot_detach(caplog):
    fake = _finalizing("binding", refuse=True)
    activity = CuptiActivity(cupti=fake, lib=False)
    activity.users = 1
    activity.idle(True)
    assert activity.status == "paused" and fake.enabled == set() and fake.finalized == 0
    assert "could not detach" in caplog.text and "MULTIPLE_SUBSCRIBERS" in caplog.text
    activity.idle(False)
    assert activity.status == "ok" and fake.registered == 1 and fake.enabled == {5, 6, 10, 19}


def test_a_user_back_before_the_detach_keeps_cupti_attached():
    """Recording needed again while CUPTI waits for a call's exit to detach: the detaching
    subscriber goes, CUPTI records again and no later call detaches it."""
    fake = _finalizing("binding")
    activity = CuptiActivity(cupti=fake, lib=False)
    activity.users = 1
    activity.idle(True)
    assert activity.status == "detaching" and fake.subscriber is not None
    activity.idle(False)
    assert activity.status == "ok" and fake.subscriber is None and fake.registered == 1
    fake.api_call()
    assert fake.finalized == 0 and fake.enabled == {5, 6, 10, 19}


class _Refusing(FakeCupti):
    def activity_register_callbacks(self, requested, completed):
        raise RuntimeError("CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED")


def test_the_shared_subscription_pauses_with_its_last_user_and_resumes(monkeypatch):
    class Counting(FakeCupti):
        def __init__(self):
            super().__init__()
            self.registered, self.enabled = 0, set()

        def activity_register_callbacks(self, requested, completed):
            self.registered += 1
            super().activity_register_callbacks(requested, completed)

        def activity_enable(self, kind):
            self.enabled.add(kind)

        def activity_disable(self, kind):
            self.enabled.discard(kind)

    fake = Counting()
    monkeypatch.setattr(cupti_mod, "_shared", None)
    monkeypatch.setattr(cupti_mod, "_shared_users", 0)
    monkeypatch.setattr(cupti_mod, "CuptiActivity",
                        lambda cupti=None: CuptiActivity(cupti=fake))
    a, b = CuptiTimer(8), CuptiTimer(8)
    assert a.activity is b.activity and fake.enabled == {5, 6, 10, 19}
    a.close()
    assert fake.enabled == {5, 6, 10, 19}                 # b still needs the kernels
    b.close()
    assert fake.enabled == set() and b.activity.status == "paused"
    c = CuptiTimer(8)
    assert c.status == "ok" and fake.enabled == {5, 6, 10, 19} and fake.registered == 1
    c.close()


# ---- failure modes seen on the H200 ---------------------------------------------------------

def test_without_api_activity_kernels_carry_no_id_and_the_log_says_why(tmp_path, rng,
                                                                       monkeypatch, host):
    """The first H200 run: only CONCURRENT_KERNEL and EXTERNAL_CORRELATION enabled, so CUPTI
    wrote no external-correlation record, no kernel joined its call and every record was
    dropped, silently. Now the API kinds are enabled, and the old setting is reported."""
    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(cuda=types.SimpleNamespace(
        get_current_stream=lambda: types.SimpleNamespace(ptr=0x7700))))
    x = rng.standard_normal((5, 8)).astype(np.float32)
    results = {}
    for kinds in (("CONCURRENT_KERNEL", "EXTERNAL_CORRELATION"), cupti_mod._KIND_NAMES):
        monkeypatch.setattr(cupti_mod, "_KIND_NAMES", kinds)
        cupti, clock = FakeCupti(), Clock()
        timer = CuptiTimer(16, activity=CuptiActivity(cupti=cupti), settle_s=0.5, clock=clock)
        d = Dispatcher("host", policy=MeasureEach())
        d.sample_every = 0
        kernels_in_run(d, "softmax", (x,), cupti, [[(1000, 4000)], [(5000, 9000)]])
        clog = CounterLog(tmp_path / f"k{len(kinds)}.alog", sample_every=1,
                          flush_interval_s=60.0, nvml=False,
                          govern=False).open()
        attach(clog, d, timer)
        d.launch("softmax", x)
        d.launch("softmax", x)
        cupti.deliver()
        clog._drain()
        clock.now += 10.0
        clog._drain()
        stats = clog.close()
        results[len(kinds)] = (stats.written, stats.dropped, clog.last_error)
    written, dropped, error = results[2]
    assert (written, dropped) == (0, 2)
    assert "no kernel record" in error and "2 kernel records, 0 external-correlation" in error
    assert results[4] == (2, 0, None)


def test_an_id_delivered_after_its_kernel_still_joins(tmp_path, rng, fake, host):
    """CUPTI hands kernels and external-correlation records over in separate buffers; an id
    arriving one harvest after its kernel must still tag it."""
    cupti, timer, clock, _ = fake
    x = rng.standard_normal((4, 9)).astype(np.float32)
    kernels_in_run(host, "softmax", (x,), cupti, [[(10_000, 17_000)], [(20_000, 23_000)]])
    clog = CounterLog(tmp_path / "late_id.alog", sample_every=1, flush_interval_s=60.0,
                      govern=False, nvml=False).open()
    attach(clog, host, timer)
    host.launch("softmax", x)
    host.launch("softmax", x)
    external = [r for r in cupti.pending if r.kind == 19]
    cupti.pending = [r for r in cupti.pending if r.kind != 19]
    cupti.deliver()                                   # kernels first, without their ids
    clog._drain()
    assert clog.stats.written == 0 and timer.activity.waiting_kernels() == 2
    cupti.pending = external
    cupti.deliver()
    clock.now += 1.0
    clog._drain()
    stats = clog.close(wait_gpu_s=0.0)   # the closing harvest hands over the last call
    assert (stats.written, stats.dropped, clog.last_error) == (2, 0, None)
    recs = read_log(tmp_path / "late_id.alog").records
    assert [r["time_ms"] for r in recs] == pytest.approx([0.007, 0.003])


def test_a_failing_buffer_callback_is_reported_once_with_its_traceback(tmp_path, rng,
                                                                       binding_fake, host,
                                                                       caplog):
    """An exception in CUPTI's thread (here a kernel record without ``end``) is lost unless
    kept: the activity keeps the first, logs it once, and the counter log reports it.
    (The ctypes buffers only copy bytes on CUPTI's thread; they parse on the reader's.)"""
    cupti, timer, clock, _ = binding_fake
    x = rng.standard_normal((4, 9)).astype(np.float32)
    kernels_in_run(host, "softmax", (x,), cupti, [[(0, 5_000)], [(6_000, 9_000)]])
    clog = CounterLog(tmp_path / "cb.alog", sample_every=1, flush_interval_s=60.0,
                      govern=False, nvml=False).open()
    attach(clog, host, timer)
    caplog.set_level("ERROR")
    for _ in range(2):
        host.launch("softmax", x)
        for r in cupti.pending:
            if r.kind == 10:
                del r.end
        cupti.deliver()
    assert timer.activity.error.startswith("CUPTI buffer callback failed: AttributeError")
    assert "Traceback" in timer.activity.error
    assert sum("CUPTI buffer callback failed" in r.message for r in caplog.records) == 1
    clog._drain()
    clock.now += 10.0
    clog._drain()
    stats = clog.close()
    assert (stats.written, stats.dropped) == (0, 2)
    assert "CUPTI buffer callback failed: AttributeError" in clog.last_error


# ---- records in any order, in any buffer (the device-state test on the H200) ------------------

def _by_launch(records):
    """The fake's records grouped per launch (a group ends with its kernel record)."""
    groups, group = [], []
    for r in records:
        group.append(r)
        if r.kind == 10:
            groups.append(group)
            group = []
    assert not group
    return groups


def test_records_in_any_order_and_buffers_join_their_calls(tmp_path, rng, fake, host):
    """The H200 device-state test lost a call whose kernel record came more than 0.5 s
    after the call, in a later buffer (CUPTI keeps a buffer while a record in it is
    incomplete, so on a busy stream records come late): here every kernel record comes
    before its id record, calls' kernels are cut across buffers of random sizes, unlogged
    launches' kernels (no id) are interleaved, and the buffers come over 3 s."""
    cupti, timer, clock, _ = fake
    x = rng.standard_normal((6, 10)).astype(np.float32)
    n_calls, t = 45, 1_000_000
    spans = []
    for _ in range(n_calls):
        k = int(rng.integers(1, 4))
        call = []
        for _ in range(k):
            dur = int(rng.integers(2_000, 40_000))
            call.append((t, t + dur))
            t += dur + int(rng.integers(500, 5_000))
        spans.append(call)
    kernels_in_run(host, "softmax", (x,), cupti, list(spans))
    clog = CounterLog(tmp_path / "order.alog", sample_every=3, flush_interval_s=60.0,
                      govern=False, nvml=False).open()
    attach(clog, host, timer)
    for _ in range(n_calls):
        host.launch("softmax", x)
    logged = [i for i in range(n_calls) if (i + 1) % 3 == 0]
    expected_ms = [(spans[i][-1][1] - spans[i][0][0]) / 1e6 for i in logged]
    # per launch: its kernel record first, then its API and id records
    order = [r for group in _by_launch(cupti.pending) for r in reversed(group)]
    assert sum(r.kind == 19 for r in order) == sum(len(spans[i]) for i in logged)
    cupti.pending = []
    rounds = 0
    while order:
        size = int(rng.integers(1, 9))
        cupti.pending, order = order[:size], order[size:]
        cupti.deliver()
        clog._drain()
        clock.now += 0.1
        rounds += 1
    assert rounds * 0.1 > 1.0                       # well past the old 0.5 s deadline
    clock.now += 1.0
    clog._drain()
    assert timer.pending == 0
    stats = clog.close()
    assert (stats.written, stats.dropped, clog.last_error) == (len(logged), 0, None)
    recs = sorted(read_log(tmp_path / "order.alog").records, key=lambda r: r["time_s"])
    assert [r["time_ms"] for r in recs] == pytest.approx(expected_ms, rel=1e-12)
    counts = timer.activity.counts
    unlogged = sum(len(spans[i]) for i in range(n_calls) if i not in logged)
    # the unlogged calls' kernels only: aged out, or still waiting (the last deliveries)
    assert counts["unmatched"] + timer.activity.waiting_kernels() == unlogged
    assert counts["other"] == sum(map(len, spans))    # one API record a launch: narrowed
    assert timer.activity.narrowed


def test_a_call_is_not_cut_short_while_its_second_kernel_is_held(tmp_path, rng, fake, host):
    """A call with two launches whose first kernel came: it waits for the second (one id
    record a launch says how many), past ``settle_s``, and a later call finishing first
    does not cut it short."""
    cupti, timer, clock, _ = fake
    x = rng.standard_normal((4, 9)).astype(np.float32)
    kernels_in_run(host, "softmax", (x,), cupti,
                   [[(1_000, 5_000), (6_000, 19_000)], [(20_000, 23_000)]])
    clog = CounterLog(tmp_path / "held.alog", sample_every=1, flush_interval_s=60.0,
                      govern=False, nvml=False).open()
    attach(clog, host, timer)
    host.launch("softmax", x)
    host.launch("softmax", x)
    groups = _by_launch(cupti.pending)
    held = groups[1][-1]                              # the first call's second kernel
    cupti.pending = [r for r in cupti.pending if r is not held]
    cupti.deliver()
    clog._drain()
    clock.now += 2.0                                  # settled, still not lost
    clog._drain()
    assert clog.stats.written == 1 and timer.pending == 1
    cupti.pending = [held]
    cupti.deliver()
    clog._drain()
    stats = clog.close()
    assert (stats.written, stats.dropped) == (2, 0)
    recs = sorted(read_log(tmp_path / "held.alog").records, key=lambda r: r["time_s"])
    assert [r["time_ms"] for r in recs] == pytest.approx([0.018, 0.003])


def test_the_closing_harvest_forces_the_held_buffers_out(tmp_path, rng, fake, host):
    """Records CUPTI keeps past the wait (a buffer a default flush leaves) are forced out
    by the log's last harvest instead of being declared lost."""
    cupti, timer, _, _ = fake
    x = rng.standard_normal((4, 9)).astype(np.float32)
    kernels_in_run(host, "softmax", (x,), cupti, [[(1_000, 9_000)], [(10_000, 12_000)]])
    cupti.held_until_forced = True
    clog = CounterLog(tmp_path / "forced.alog", sample_every=1, flush_interval_s=60.0,
                      govern=False, nvml=False).open()
    attach(clog, host, timer)
    host.launch("softmax", x)
    host.launch("softmax", x)
    clog._drain()
    assert clog.stats.written == 0 and timer.pending == 2
    stats = clog.close(wait_gpu_s=0.0)
    assert (stats.written, stats.dropped, clog.last_error) == (2, 0, None)
    assert [r["time_ms"] for r in read_log(tmp_path / "forced.alog").records] == \
        pytest.approx([0.008, 0.002])


def test_timers_sharing_the_subscription_keep_their_own_calls(tmp_path, rng, monkeypatch):
    """One CUPTI subscription a process: two logs (or two devices) read the same records.
    Ids come from one sequence, so neither takes the other's kernels, and kernels of a
    closed log's calls never join a later log's calls."""
    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(cuda=types.SimpleNamespace(
        get_current_stream=lambda: types.SimpleNamespace(ptr=0x7700))))
    cupti, clock = FakeCupti(), Clock()
    activity = CuptiActivity(cupti=cupti)
    x = rng.standard_normal((4, 9)).astype(np.float32)
    timers, clogs, dispatchers = [], [], []
    for i, spans in enumerate(([[(1_000, 4_000)], [(9_000, 10_000)]],
                               [[(5_000, 8_000)], [(11_000, 19_000)]])):
        timer = CuptiTimer(16, activity=activity, clock=clock)
        d = Dispatcher("host", policy=MeasureEach())
        d.sample_every = 0
        kernels_in_run(d, "softmax", (x,), cupti, spans)
        clog = CounterLog(tmp_path / f"s{i}.alog", sample_every=1, flush_interval_s=60.0,
                          govern=False, nvml=False).open()
        attach(clog, d, timer)
        timers.append(timer), clogs.append(clog), dispatchers.append(d)
    for _ in range(2):                                # interleaved: a, b, a, b
        for d in dispatchers:
            d.launch("softmax", x)
    cupti.deliver()
    for clog in clogs[::-1]:                          # the second log harvests first
        clog._drain()
    clock.now += 1.0
    for clog in clogs:
        clog._drain()
    times = []
    for i, clog in enumerate(clogs):
        stats = clog.close()
        assert (stats.written, stats.dropped, clog.last_error) == (2, 0, None)
        times.append([r["time_ms"] for r in read_log(tmp_path / f"s{i}.alog").records])
    assert times == [pytest.approx([0.003, 0.001]), pytest.approx([0.003, 0.008])]
    # a closed log's call whose kernel comes late, then a new log: ids never repeat
    late = CuptiTimer(16, activity=activity, clock=clock)
    late.push_id(next(late.ids))
    cupti.launch("late", 30_000, 90_000)
    late.pop_id()
    late.close()
    fresh = CuptiTimer(16, activity=activity, clock=clock)
    ext = next(fresh.ids)
    fresh.push_id(ext)
    cupti.launch("fresh", 100_000, 101_000)
    fresh.pop_id()
    fresh.append_pending((ext, "fresh"))
    cupti.deliver()
    fresh.harvest_entries()
    clock.now += 1.0
    assert fresh.harvest_entries() == [((ext, "fresh"), pytest.approx(0.001))]
    fresh.close()


def test_a_launch_the_narrowing_missed_widens_the_api_records(tmp_path, rng, fake, host):
    """Kernels launched through a call the launch list does not name get no id record:
    their call is dropped once, said, and the API records are widened to every call."""
    cupti, timer, clock, _ = fake
    x = rng.standard_normal((4, 9)).astype(np.float32)
    d_spans = [[(1_000, 3_000)], [(4_000, 9_000)]]

    def through_memalloc():                           # cbid 2: not a launch call
        start, end = d_spans.pop(0)[0]
        cupti.launch("odd", start, end, cbid=2 if d_spans else 3)
    before_run(host, "softmax", (x,), through_memalloc)
    clog = CounterLog(tmp_path / "wide.alog", sample_every=1, flush_interval_s=60.0,
                      govern=False, nvml=False).open()
    attach(clog, host, timer)
    host.launch("softmax", x)
    cupti.deliver()
    clog._drain()
    clock.now += 10.0
    clog._drain()
    assert timer.dropped == 1 and not timer.activity.narrowed
    assert "1 kernels wait for their id" in clog.last_error
    assert "API records narrowed to launches (now widened" in clog.last_error
    host.launch("softmax", x)                         # now every API call has its record
    cupti.deliver()
    clog._drain()
    clock.now += 1.0
    clog._drain()
    stats = clog.close()
    assert (stats.written, stats.dropped) == (1, 1)


def test_a_call_lost_with_its_id_record_in_never_widens_the_api_records(tmp_path, rng,
                                                                         fake, host):
    """A tagged call whose id record came but whose kernel never did is lost, while an
    untagged call's kernel waits for an id that never comes: that is no sign of a launch
    call the narrowing missed, and widening would record every API call for good."""
    cupti, timer, clock, _ = fake
    x = rng.standard_normal((4, 9)).astype(np.float32)
    before_run(host, "softmax", (x,), lambda: cupti._api(3, 1_000))   # the id record only
    clog = CounterLog(tmp_path / "narrow.alog", sample_every=1, flush_interval_s=60.0,
                      govern=False, nvml=False).open()
    attach(clog, host, timer)
    host.launch("softmax", x)
    cupti.launch("untagged", 2_000, 3_000)            # no id pushed: waits for none
    cupti.deliver()
    clog._drain()
    assert timer.activity.waiting_kernels() == 1
    clock.now += 10.0
    clog._drain()
    assert timer.dropped == 1 and timer.activity.narrowed
    assert "no kernel record came" in clog.last_error and "widened" not in clog.last_error
    clog.close()


def test_api_records_are_narrowed_to_launch_calls_only_when_every_switch_took():
    """One id record a launch is what a call's kernel count is checked against: when a
    non-launch call cannot be switched off, the activity says it is not narrowed."""
    class Stubborn(FakeCupti):
        def activity_enable_driver_api(self, cbid, enable):
            if cbid == 1 and not enable:
                raise RuntimeError("CUPTI_ERROR_NOT_SUPPORTED")
            super().activity_enable_driver_api(cbid, enable)

    ok, stubborn = FakeCupti(), Stubborn()
    assert CuptiActivity(cupti=ok).narrowed
    assert ok.api_off == {("driver", 1), ("driver", 2), ("driver", 5), ("runtime", 1)}
    assert not CuptiActivity(cupti=stubborn).narrowed
    assert ("driver", 2) in stubborn.api_off          # the others still off: fewer records
