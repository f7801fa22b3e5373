"""The cuda backend itself: device description, streams, array interop, caching."""

from __future__ import annotations

import numpy as np
import pytest

from adaptive.ops import get_op

pytestmark = pytest.mark.gpu

SPIN = r'''extern "C" __global__ void spin(long long cycles) {
    long long t0 = clock64(); while (clock64() - t0 < cycles) {} }'''


@pytest.fixture(scope="module")
def dispatcher():
    from adaptive import Dispatcher
    return Dispatcher("cuda")


def _softmax(d, x, **kw):
    return d.launch("softmax", x, variant="warp_row", config={"WARPS": 4, "VEC": 4}, **kw)


def test_limits_fingerprint_peaks(dispatcher):
    b = dispatcher.backend
    lim = b.limits()
    assert lim["max_threads_per_block"] == 1024 and lim["warp_size"] == 32
    assert lim["sm_count"] > 0 and lim["max_shared_bytes"] >= 48 * 1024 and lim["cc"] >= 70
    fp = b.fingerprint()
    assert fp["cc"] == lim["cc"] and fp["driver_version"] > 0 and fp["name"]
    peaks = b.peaks()
    assert peaks["bytes_per_s"] > 1e11 and peaks["flops_per_s"]["float16"] > 1e13


def test_cupy_nonblocking_stream_orders_after_prior_work(cp, dispatcher, rng):
    x_old = rng.standard_normal((256, 512)).astype(np.float32)
    x_new = rng.standard_normal((256, 512)).astype(np.float32)
    x = cp.asarray(x_old)
    _softmax(dispatcher, x)                      # compile and plan outside the stream
    cp.cuda.Device().synchronize()
    spin = cp.RawKernel(SPIN, "spin")
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        spin((1,), (1,), (np.int64(200_000_000),))   # ~0.1 s of work ahead on s
        x.set(x_new, stream=s)
        out = _softmax(dispatcher, x)
    s.synchronize()
    ref = get_op("softmax").reference(x_new)
    np.testing.assert_allclose(out.get(), ref, rtol=1e-4, atol=1e-6)


def test_torch_in_torch_out_on_torch_stream(dispatcher, rng):
    torch = pytest.importorskip("torch")
    x_old = rng.standard_normal((256, 512)).astype(np.float32)
    x_new = rng.standard_normal((256, 512)).astype(np.float32)
    x = torch.from_numpy(x_old).cuda()
    _softmax(dispatcher, x)
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        torch.cuda._sleep(200_000_000)
        x.copy_(torch.from_numpy(x_new).cuda(non_blocking=True))
        out = _softmax(dispatcher, x)
    s.synchronize()
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float32 and out.is_cuda
    ref = get_op("softmax").reference(x_new)
    np.testing.assert_allclose(out.cpu().numpy(), ref, rtol=1e-4, atol=1e-6)


def test_torch_stream_is_torchs_current_stream_also_on_a_side_stream(dispatcher):
    torch = pytest.importorskip("torch")
    from adaptive.backends.cuda import torch_stream
    assert torch_stream().ptr == torch.cuda.current_stream().cuda_stream
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        assert torch_stream().ptr == s.cuda_stream != 0
    assert torch_stream().ptr == torch.cuda.current_stream().cuda_stream


def test_hold_keeps_the_stream_busy_for_about_the_time_asked(dispatcher, cp):
    stream = cp.cuda.Stream(non_blocking=True)
    start, stop = cp.cuda.Event(), cp.cuda.Event()
    with stream:
        dispatcher.backend.hold(stream.ptr, 1.0)          # compile and load once
        start.record()
        dispatcher.backend.hold(stream.ptr, 500.0)
        stop.record()
    stop.synchronize()
    held_ms = cp.cuda.get_elapsed_time(start, stop)
    assert 0.4 <= held_ms <= 2.0, held_ms


def test_torch_bfloat16_gemm_through_every_path(dispatcher, rng):
    torch = pytest.importorskip("torch")
    a = torch.from_numpy(rng.standard_normal((70, 96)).astype(np.float32)).cuda().bfloat16()
    b = torch.from_numpy(rng.standard_normal((96, 40)).astype(np.float32)).cuda().bfloat16()
    ref = a.double().cpu().numpy() @ b.double().cpu().numpy()
    for variant, config in (("cublas", None), ("tc_mma", {"BM": 128, "BN": 64, "WARPS_M": 2,
                                                          "WARPS_N": 2, "STAGES": 2})):
        out = dispatcher.launch("gemm", a, b, variant=variant, config=config)
        assert isinstance(out, torch.Tensor) and out.dtype == torch.bfloat16, variant
        err = np.linalg.norm(out.double().cpu().numpy() - ref) / np.linalg.norm(ref)
        assert err < 3e-2, f"{variant}: relative error {err:.2e}"


class _CAI:
    """A foreign array: only __cuda_array_interface__."""

    def __init__(self, arr):
        self._arr = arr
        self.__cuda_array_interface__ = arr.__cuda_array_interface__


def test_cuda_array_interface_inputs(cp, dispatcher, rng):
    a = rng.standard_normal((33, 20)).astype(np.float32)
    b = rng.standard_normal((20, 17)).astype(np.float32)
    out = dispatcher.launch("gemm", _CAI(cp.asarray(a)), _CAI(cp.asarray(b)),
                            variant="simt_tiled",
                            config={"BM": 32, "BN": 64, "BK": 16, "TM": 4, "TN": 4})
    np.testing.assert_allclose(cp.asnumpy(out), a.astype(np.float64) @ b, rtol=1e-4, atol=1e-5)


def test_numpy_inputs_are_copied_in_and_out(dispatcher, rng):
    x = rng.standard_normal((9, 130)).astype(np.float16)
    out = _softmax(dispatcher, x)
    assert isinstance(out, np.ndarray) and out.dtype == np.float16
    np.testing.assert_allclose(out, get_op("softmax").reference(x), rtol=5e-3, atol=1e-4)


def test_warm_call_reuses_plan_and_cached_cubin(cp, dispatcher, rng):
    x = cp.asarray(rng.standard_normal((10, 64)).astype(np.float32))
    _softmax(dispatcher, x)
    n_modules = len(dispatcher.backend._modules)
    for _ in range(3):
        _softmax(dispatcher, x)
    assert len(dispatcher.backend._modules) == n_modules


def test_default_policy_picks_a_working_cuda_variant(cp, rng):
    from adaptive import Dispatcher, Registry
    from adaptive.variants import shared_registry
    reg = Registry(v for v in shared_registry().variants("softmax", "cuda")
                   if v.name == "warp_row")
    d = Dispatcher("cuda", registry=reg)
    x = rng.standard_normal((100, 300)).astype(np.float32)
    out = d.launch("softmax", cp.asarray(x))
    np.testing.assert_allclose(out.get(), get_op("softmax").reference(x), rtol=1e-4,
                               atol=1e-6)
    assert d.decision("softmax", cp.asarray(x)).candidate.variant.name == "warp_row"


def test_split_k_plan_on_two_streams_at_once_keeps_each_result(cp, dispatcher, rng):
    """One split-K plan launched on two streams concurrently: each stream has its own
    workspace (partials and tile counters), so neither corrupts the other."""
    m, n, k = 37, 129, 4096
    cfg = next(c.config for c in dispatcher.candidates(
        "gemm", cp.zeros((m, k), cp.float32), cp.zeros((k, n), cp.float32))
        if c.variant.name == "splitk")
    host = [(rng.standard_normal((m, k)).astype(np.float32),
             rng.standard_normal((k, n)).astype(np.float32)) for _ in range(2)]
    dev = [(cp.asarray(a), cp.asarray(b)) for a, b in host]
    spin = cp.RawKernel(SPIN, "spin")
    streams = [cp.cuda.Stream(non_blocking=True) for _ in range(2)]
    outs = [[], []]
    for _ in range(20):                                # interleaved, both streams busy
        for i, s in enumerate(streams):
            with s:
                spin((1,), (1,), (np.int64(20_000),))
                out = cp.full((m, n), np.nan, cp.float32)
                outs[i].append(dispatcher.launch("gemm", *dev[i], out=out, variant="splitk",
                                                 config=cfg))
    for s in streams:
        s.synchronize()
    for i, (a, b) in enumerate(host):
        ref = a.astype(np.float64) @ b.astype(np.float64)
        for out in outs[i]:
            np.testing.assert_allclose(out.get(), ref, rtol=1e-4, atol=1e-3)
