"""Host cost per call of adaptive's warm paths on PyTorch tensors, beside plain torch.

A decode loop of a transformers model is host-bound on the H200 (~14 ms of Python per
token for a 1B model, ~4 ms of GPU work), so what adaptive adds per call is what a user
loses. Each case runs many calls of a small input back to back (the GPU keeps up) and
reports wall time per call after a synchronise: the host path, kernels included.

Cases (fp16, M = 1 decode shapes of a 1B Llama layer):
  torch.mm / F.linear          what the plain model runs
  held plan: cublas            a committed plan held by AdaptiveLinear (torch.mm inside)
  held plan: tc_wide           the same through our own kernel (CuPy launch on torch's stream)
  AdaptiveLinear (cublas)      the patched layer's forward, plan held
  launch("gemm")               the dispatcher's hot path (key + lookup + plan)
  SDPA decode / adaptive hit   attention at one cached length
  adaptive, Lk + 1 per call    a decode loop: each step a new key of a decided class
  held plan: sdpa / splitkv    (GPU) decode attention at gpu_generate's model shape, and
                               a miss per new Lk through a dispatcher of each alone
  F.linear vs torch.mm(W, xT)  (GPU) the two cuBLAS layouts of a weight kept as given, at
                               decode row counts, wall and device time per call
  LlamaRMSNorm / AdaptiveRMSNorm  transformers' eight-op norm against the patched one (its
                               plan held) and the op's candidates held, decode and prefill rows
  gemm / attention from CuPy   (GPU; alone with ``--cases cupy-gemm,cupy-attention``)
                               held plans on CuPy arrays, as gpu_contention and
                               gpu_selection call: cupy.matmul, the cublas variant and
                               tc_wide at M=128 N=K=4096; sdpa_torch and flash_mma at B=1
                               H=16 L=1024 causal; each call back to back and its issuing
                               alone (what a host-bound class is charged)
  SDPA from CuPy, in parts     (GPU; ``--cases cupy-sdpa-parts``) the stream context, four
                               ways of viewing a CuPy array in torch, SDPA, the copy

    PYTHONPATH=$PWD python3 benchmarks/gpu_hostpath.py --out $OUT
    PYTHONPATH=$PWD python3 benchmarks/gpu_hostpath.py --cases cupy-gemm,cupy-attention --out $OUT
    python benchmarks/gpu_hostpath.py --device host --quick          # dry run on the CPU
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

BENCH = "gpu_hostpath"


def _per_call_us(fn, calls: int, rounds: int, sync) -> float:
    fn()
    sync()
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter_ns()
        for _ in range(calls):
            fn()
        sync()
        times.append((time.perf_counter_ns() - t0) / calls / 1e3)
    return statistics.median(times)


def _only(registry, op: str, name: str, config: dict | None = None):
    """A dispatcher whose registry holds one candidate: its plan is what we time."""
    import adaptive
    from adaptive.policy import First
    from adaptive.space import Space
    from adaptive.variants import Registry
    v = registry.get(op, name)
    if config:
        v = dataclasses.replace(v, space=Space.from_dict({k: [x] for k, x in config.items()}))
    with adaptive.config.override(sample_every=0):
        return adaptive.Dispatcher(backend=v.backend, policy=First(), registry=Registry([v]))


def _device_us(fn, calls: int = 200) -> float:
    """Device µs per call of ``fn``: its launches queued behind a sleeping kernel, so the
    event pair around them times the kernels alone, not the host's issuing."""
    import torch
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    fn()
    torch.cuda.synchronize()
    torch.cuda._sleep(200_000_000)           # ~0.1 s: the host queues every call meanwhile
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / calls


def _linear_layout_cases(rows, dev, dtype, calls: int, rounds: int, sync) -> None:
    """A weight kept as given, ``W [N, K]``, at the example server's 1b linears and decode
    row counts: ``F.linear(x, W)`` (cuBLAS TN, what torch runs) against ``torch.mm(W, xᵀ)``
    (NN, what the dispatcher's cuBLAS plan of ``gemm(W, xᵀ)`` runs), device µs and wall µs
    per call. Run S33's server served every linear the NN way and stepped its decode in
    9.8 ms; run S35's F.linear in 18.7 ms."""
    import torch
    import torch.nn.functional as F
    for n, k in ((2048, 2048), (512, 2048), (8192, 2048), (2048, 8192)):
        w = torch.randn(n, k, device=dev, dtype=dtype) / k ** 0.5
        for m in (1, 8, 32):
            x = torch.randn(m, k, device=dev, dtype=dtype)
            xt = x.t().contiguous()
            for name, fn in (("F.linear(x, W) (TN)", lambda: F.linear(x, w)),
                             ("torch.mm(W, xT) (NN)", lambda: torch.mm(w, xt)),
                             ("torch.mm(W, xT) with both transposes",
                              lambda: torch.mm(w, x.t().contiguous()).t().contiguous())):
                rows.append({"case": f"{name}, M={m} N={n} K={k}",
                             "us_per_call": _per_call_us(fn, calls, rounds, sync),
                             "note": f"device {_device_us(fn):.2f} us"})


def _decode_attention_cases(case, reg, calls: int, dev, dtype, sync, rows,
                            names=("sdpa_torch", "splitkv_mma")) -> None:
    """Decode attention at gpu_generate's model shape (B=1, 32 heads, 8 kv heads, D=64,
    Lk=1024): the held plan of SDPA (any key of its class) against our split-KV kernel's
    (bound to its key's shapes), and what a new key costs each: a decode step's first
    layer meets a new Lk, which a split-KV plan prepares (a miss per step) and SDPA's
    plan takes as it is. A miss is timed over one pass of new lengths on a fresh
    dispatcher (every call a miss of a decided class)."""
    import torch
    q = torch.randn(1, 32, 1, 64, device=dev, dtype=dtype)
    lk0, n = 1024, min(calls, 400)
    ks = [torch.randn(1, 8, lk0 + i, 64, device=dev, dtype=dtype) for i in range(n + 1)]
    shape = "B=1 H=32 Hkv=8 D=64"
    for name in names:
        d = _only(reg, "attention", name)
        plan = d.plan("attention", q, ks[0], ks[0], causal=False)
        k0 = ks[0]
        case(f"held plan: {plan.candidate.label}, {shape} Lk={lk0}",
             lambda: plan.run((q, k0, k0), None))
        times = []
        for _ in range(3):
            fresh = _only(reg, "attention", name)
            fresh.run("attention", (q, ks[0], ks[0]), None, {"causal": False})
            sync()
            t0 = time.perf_counter_ns()
            for kk in ks[1:]:
                fresh.run("attention", (q, kk, kk), None, {"causal": False})
            sync()
            times.append((time.perf_counter_ns() - t0) / n / 1e3)
        rows.append({"case": f"{name} through a dispatcher, a new Lk per call, {shape}",
                     "us_per_call": statistics.median(times),
                     "note": f"every call a miss of a decided class ({n} lengths from "
                             f"{lk0 + 1}; misses {fresh.stats['misses'] - 1})"})
        rows.append(_class_miss_parts(reg, name, q, ks, shape, sync))


def _class_miss_parts(reg, name: str, q, ks, shape: str, sync) -> dict:
    """One pass of new lengths (each a class miss) on a fresh dispatcher, profiled: the
    median miss and its deciding and preparing (the dispatcher's miss log), and the
    functions with the most time of their own per miss (run S81/S85's servers paid
    ~0.37 ms a decode step for it, 0.25 ms of it preparing). Other threads' waits, which
    Python 3.12's cProfile records too, are left out."""
    import cProfile
    import pstats
    fresh = _only(reg, "attention", name)
    fresh.run("attention", (q, ks[0], ks[0]), None, {"causal": False})
    sync()
    since = time.time()
    prof = cProfile.Profile()
    prof.enable()
    for kk in ks[1:]:
        fresh.run("attention", (q, kk, kk), None, {"causal": False})
    prof.disable()
    sync()
    misses = [m for m in fresh.recent_misses(since) if m["how"] == "class"]
    n = max(1, len(misses))

    def med(field: str) -> float:
        return statistics.median(m[field] for m in misses) * 1e3 if misses else math.nan
    waits = ("acquire", "wait", "poll", "sleep", "select")
    top = sorted(((tt, where) for where, (_, _, tt, _, _) in pstats.Stats(prof).stats.items()
                  if not any(w in where[2] for w in waits)), reverse=True)[:10]
    parts = "; ".join(f"{where[2]} ({Path(where[0]).name}:{where[1]}) {tt / n * 1e6:.1f}"
                      for tt, where in top)
    return {"case": f"{name}: a class miss's parts, {shape}", "us_per_call": med("ms"),
            "note": f"{len(misses)} class misses; median deciding {med('decide_ms'):.1f} "
                    f"us, preparing {med('prepare_ms'):.1f} us; most own time a miss, us: "
                    + parts}


def _norm_cases(case, reg, dev, dtype, hidden: int, cuda: bool, rows) -> None:
    """transformers' LlamaRMSNorm (eight torch ops) against AdaptiveRMSNorm with a held
    plan and the held plans of the op's two candidates, at gpu_generate's decode and
    prefill row counts; on the GPU each with its device time per call."""
    import torch
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    import adaptive
    from adaptive.integrations.norm import AdaptiveRMSNorm
    plain = LlamaRMSNorm(hidden, eps=1e-5).to(device=dev, dtype=dtype).eval()
    with torch.no_grad():
        plain.weight.normal_()
    patched = AdaptiveRMSNorm(LlamaRMSNorm(hidden, eps=1e-5).to(device=dev, dtype=dtype),
                              "norm").eval()
    patched.load_state_dict(plain.state_dict())
    names = ("rmsnorm_torch", "rms_rows") if cuda else ("torch_rmsnorm", "host_numpy")
    for shape in ((1, 1, hidden), (16, 1, hidden), (8, 512 if cuda else 16, hidden)):
        x = torch.randn(*shape, device=dev, dtype=dtype)
        x2 = x.view(-1, hidden)
        w = plain.weight.detach()
        label = "x".join(map(str, shape))
        # past the patched norm's exploring calls, until it holds a plan; exploring without
        # the budget (the cases before spend it: run S42's norm was deferred to the
        # baseline at its miss, with no rms_rows timed)
        with torch.no_grad(), adaptive.unbounded_exploration():
            warm = 0
            while patched.route_of(x) == "dispatcher" and warm < 4000:
                patched(x)
                warm += 1
        held = patched._held.get(x.shape) or patched._own.get(x.shape)
        holds = (f"holds {held.candidate.label} after {warm} calls" if held is not None
                 else f"no plan held after {warm} calls")
        fns = [(f"LlamaRMSNorm, x {label}", lambda: plain(x)),
               (f"AdaptiveRMSNorm forward, x {label}", lambda: patched(x))]
        for name in names:
            plan = _only(reg, "rmsnorm", name).plan("rmsnorm", x2, w, eps=1e-5)
            fns.append((f"held plan: {plan.candidate.label}, x {label}",
                        lambda plan=plan: plan.run((x2, w), None)))
        for name, fn in fns:
            case(name, fn)
            if cuda:
                with torch.no_grad():
                    rows[-1]["note"] = f"device {_device_us(fn):.2f} us"
            if name.startswith("AdaptiveRMSNorm"):
                rows[-1]["note"] = (rows[-1]["note"] + "; " + holds).lstrip("; ")


def _issue_us(fn, calls: int = 200) -> float:
    """Median host µs of issuing ``fn()`` alone: the device drained before each call and
    the call's own time only (what the policy charges a host-bound class's candidate)."""
    import cupy
    stream = cupy.cuda.get_current_stream()
    fn()
    times = []
    for _ in range(calls):
        stream.synchronize()
        t0 = time.perf_counter_ns()
        fn()
        times.append((time.perf_counter_ns() - t0) / 1e3)
    stream.synchronize()
    return statistics.median(times)


def _cupy_gemm_cases(case, reg) -> None:
    """gemm from CuPy arrays, M=128 N=K=4096 fp16, each way held: the host time a call
    costs a CuPy caller in a loop the GPU keeps up with, and (in the note) its issuing
    alone with the device idle (run S51: cuBLAS's exploring issuing read 83 us from CuPy
    arrays, where tc_wide's read 19)."""
    import cupy
    a = cupy.random.rand(128, 4096, dtype=cupy.float32).astype(cupy.float16)
    b = cupy.random.rand(4096, 4096, dtype=cupy.float32).astype(cupy.float16)
    out = cupy.empty((128, 4096), cupy.float16)

    def matmul():
        cupy.matmul(a, b, out=out)
    case("cupy.matmul(a, b, out), CuPy M=128 N=K=4096", matmul,
         f"issuing alone {_issue_us(matmul):.1f} us")
    ref = a.astype(cupy.float32) @ b.astype(cupy.float32)
    for name in ("cublas", "tc_wide"):
        plan = _only(reg, "gemm", name).plan("gemm", a, b)
        got = plan.run((a, b), None).astype(cupy.float32)
        err = float(cupy.abs(got - ref).max() / cupy.abs(ref).max())

        def held(plan=plan):
            plan.run((a, b), out)
        case(f"held plan: {plan.candidate.label[:24]}, CuPy M=128 N=K=4096", held,
             f"max error / max |ref| {err:.1e}; issuing alone {_issue_us(held):.1f} us")


def _cupy_attention_cases(case, reg) -> None:
    """attention from CuPy arrays, B=1 H=16 L=1024 D=128 causal fp16 (the contention
    run's prefill row, where flash_mma was committed at 1.7x SDPA): sdpa_torch (a DLPack
    round trip into torch) and flash_mma held, each call's time back to back and its
    issuing alone (S54: SDPA's exploring samples read 0.132 ms for 0.027 ms of kernel)."""
    import cupy
    shape = (1, 16, 1024, 128)
    q, k, v = (cupy.random.rand(*shape, dtype=cupy.float32).astype(cupy.float16)
               for _ in range(3))
    out = cupy.empty(shape, cupy.float16)
    for name in ("sdpa_torch", "flash_mma"):
        d = _only(reg, "attention", name)
        plan = d.plan("attention", q, k, v, causal=True)

        def held(plan=plan):
            plan.run((q, k, v), out)
        case(f"held plan: {plan.candidate.label[:24]}, CuPy B=1 H=16 L=1024 causal", held,
             f"issuing alone {_issue_us(held):.1f} us")


def _cupy_sdpa_parts(case, reg) -> None:
    """sdpa_torch's issuing from CuPy arrays split into its parts (run S55: 95 us issuing
    alone, held, at B=1 H=16 L=1024 causal; S60's contention run charged it 165-196 us):
    the stream context, each way of viewing a CuPy array as a torch tensor (DLPack with
    the protocol's stream exchange, DLPack with stream -1 (no exchange), the legacy
    capsule, ``__cuda_array_interface__``), SDPA on torch tensors, and the copy into
    ``out``. Each part's issuing alone, the device drained before each call."""
    import cupy
    import torch
    import torch.nn.functional as F

    from adaptive.backends.torch_streams import cupy_stream
    shape = (1, 16, 1024, 128)
    q = cupy.random.rand(*shape, dtype=cupy.float32).astype(cupy.float16)
    tq = torch.from_dlpack(q)
    to = torch.empty_like(tq)
    ways = {"torch.from_dlpack(x)": lambda: torch.from_dlpack(q),
            "torch.from_dlpack(x.__dlpack__(stream=-1))":
                lambda: torch.from_dlpack(q.__dlpack__(stream=-1)),
            "torch.utils.dlpack.from_dlpack(x.toDlpack())":
                lambda: torch.utils.dlpack.from_dlpack(q.toDlpack()),
            "torch.as_tensor(x, device='cuda')": lambda: torch.as_tensor(q, device="cuda")}

    def stream_ctx():
        with cupy_stream(torch, 0):
            pass

    def device_ctx():
        with torch.cuda.device(0):
            pass
    parts = {"cupy_stream(torch, 0) enter and exit": stream_ctx,
             "torch.cuda.device(0) enter and exit": device_ctx,
             **ways,
             "F.scaled_dot_product_attention(is_causal) on torch tensors":
                 lambda: F.scaled_dot_product_attention(tq, tq, tq, is_causal=True),
             "out.copy_(result)": lambda: to.copy_(tq)}
    for name, fn in parts.items():
        try:
            fn()
        except Exception as e:   # a way this CuPy or torch does not take: said, not timed
            print(f"  sdpa part {name}: {type(e).__name__}: {e}"[:300], flush=True)
            continue
        case(f"sdpa part: {name}", fn, f"issuing alone {_issue_us(fn):.1f} us")


def measure(device: str, quick: bool, cases: str = "all") -> list[dict]:
    import torch
    import torch.nn.functional as F

    import adaptive
    from adaptive.integrations.linear import AdaptiveLinear
    from adaptive.variants import default_registry
    cuda = device == "cuda"
    dev = "cuda" if cuda else "cpu"
    dtype = torch.float16 if cuda else torch.float32
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    calls, rounds = (50, 2) if quick else (2000, 5)
    hidden = 64 if quick else 2048
    reg = default_registry()
    torch.manual_seed(0)
    x = torch.randn(1, hidden, device=dev, dtype=dtype)
    lin = torch.nn.Linear(hidden, hidden, bias=False, device=dev, dtype=dtype).eval()
    w = lin.weight.detach()
    wt = w.t().contiguous()
    rows = []

    def case(name, fn, note=""):
        with torch.no_grad():
            us = _per_call_us(fn, calls, rounds, sync)
        rows.append({"case": name, "us_per_call": us, "note": note})

    if cases != "all":
        if not cuda:
            raise SystemExit(f"--cases {cases} needs CUDA (CuPy arrays on a GPU)")
        case("torch.mm(x, wt)", lambda: torch.mm(x, wt))
        for name in cases.split(","):
            CUPY_CASES[name](case, reg)
        return _against_mm(rows)

    case("torch.mm(x, wt)", lambda: torch.mm(x, wt))
    case("F.linear(x, w)", lambda: F.linear(x, w))
    library = "cublas" if cuda else "host_blas"
    d_lib = _only(reg, "gemm", library, None if cuda else {"threads": 1})
    plan = d_lib.plan("gemm", x, wt)
    case(f"held plan: {library}", lambda: plan.run((x, wt), None))
    if cuda:
        d_k = _only(reg, "gemm", "tc_wide")
        kplan = d_k.plan("gemm", x, wt)
        case(f"held plan: {kplan.candidate.label}", lambda: kplan.run((x, wt), None))
    layer = AdaptiveLinear(lin).eval()
    case("AdaptiveLinear forward (default dispatcher)", lambda: layer(x))
    case("launch('gemm') through the dispatcher", lambda: d_lib.run("gemm", (x, wt), None, {}))

    heads, kv_heads, d = (4, 2, 16) if quick else (32, 8, 128)
    lk0 = 64 if quick else 512
    q = torch.randn(1, heads, 1, d, device=dev, dtype=dtype)
    ks = [torch.randn(1, kv_heads, lk0 + i, d, device=dev, dtype=dtype)
          for i in range(calls + 2)]
    k = ks[0]
    case("SDPA decode (enable_gqa)", lambda: F.scaled_dot_product_attention(
        q, k, k, enable_gqa=True))
    att = adaptive.Dispatcher(backend="cuda" if cuda else "host", policy="measure-each")
    att.run("attention", (q, k, k), None, {"causal": True})
    case("adaptive attention, a hit", lambda: att.run("attention", (q, k, k), None,
                                                     {"causal": True}))
    step = iter(range(10 ** 9))

    def next_step():
        kk = ks[next(step) % len(ks)]
        return att.run("attention", (q, kk, kk), None, {"causal": True})
    misses = att.stats["misses"]
    case("adaptive attention, Lk + 1 per call", next_step,
         "the first pass over the lengths misses (a decided class), later passes hit")
    rows[-1]["note"] += f"; misses {att.stats['misses'] - misses}"
    _norm_cases(case, reg, dev, dtype, hidden, cuda, rows)
    if cuda:
        _decode_attention_cases(case, reg, calls, dev, dtype, sync, rows)
        _linear_layout_cases(rows, dev, dtype, calls, rounds, sync)
        _cupy_gemm_cases(case, reg)
        _cupy_attention_cases(case, reg)
    elif quick:   # the dry run: the host's two attention variants in their places
        _decode_attention_cases(case, reg, 8, dev, dtype, sync, rows,
                                ("host_materialised", "host_chunked"))
    return _against_mm(rows)


def _against_mm(rows: list[dict]) -> list[dict]:
    """``rows`` with each one's µs against the first row's (torch.mm)."""
    for r in rows:
        r["vs_torch_mm_us"] = r["us_per_call"] - rows[0]["us_per_call"]
    return rows


def main(out_dir: str, device: str = "auto", quick: bool = False,
         cases: str = "all") -> list[dict]:
    from adaptive.backends import resolve_name
    backend = resolve_name(device)
    rows = measure(backend, quick, cases)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{BENCH}.json").write_text(json.dumps(rows, indent=1))
    print(f"{'case':<48} {'us/call':>9} {'vs torch.mm':>12}")
    for r in rows:
        print(f"{r['case']:<48} {r['us_per_call']:>9.2f} {r['vs_torch_mm_us']:>+12.2f}  "
              f"{r['note']}")
    return [{"bench": BENCH, "case": r["case"], "value": f"{r['us_per_call']:.2f}",
             "unit": "us/call", "note": f"{r['vs_torch_mm_us']:+.2f} vs torch.mm; {r['note']}"}
            for r in rows]


CUPY_CASES = {"cupy-gemm": _cupy_gemm_cases, "cupy-attention": _cupy_attention_cases,
              "cupy-sdpa-parts": _cupy_sdpa_parts}


def cli(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    p.add_argument("--device", choices=("auto", "cuda", "host"), default="auto")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--cases", default="all",
                   help="all, or a comma-separated list of " + ", ".join(CUPY_CASES)
                   + " (GPU: only those calls from CuPy arrays)")
    args = p.parse_args(argv)
    if args.cases != "all" and not set(args.cases.split(",")) <= set(CUPY_CASES):
        p.error(f"--cases {args.cases!r}: expected all or some of {', '.join(CUPY_CASES)}")
    main(args.out, args.device, args.quick, args.cases)
    return 0


if __name__ == "__main__":
    sys.exit(cli())
