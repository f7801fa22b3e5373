"""Counter-logging overhead: a stream of small launches with NVML sampling and logging of
every call, against both off, side by side in one run; the log's GPU times against
CUDA-event timings; a plot drawn from the real log.

    PYTHONPATH=$PWD python3 benchmarks/gpu_counterlog.py --out $OUT       # H200, < 2 min
    python benchmarks/gpu_counterlog.py --device host --quick             # a dry run on CPU

Two streams, each a round-robin over three inputs (so several plans are live):
``gpu_bound`` (kernels of tens of microseconds: the GPU, not Python, sets the pace) and
``host_bound`` (tiny kernels: the per-launch host cost shows in full). Rounds alternate
off / on (order flipped every round) on one dispatcher with its own sampling off, so the
log is the only difference; "on" starts the NVML sampler (0.1 s, GPM 0.2 s) and attaches
the counter log, "off" has neither. The log's writer is idle before every "off" round.

Agreement: per input, the median of the log's event-timed records against CUDA events
around ``--ref-block`` back-to-back launches of that input alone (divided by the block).

Attribution (``--attribute``, default on): more modes in the same alternation,
``events`` (only a pre-created CUDA event pair recorded around each launch with the raw
runtime call: the GPU-side and driver cost of event timing, nothing else),
``events_end`` (one event after each launch: what a single event costs) and ``log``
(the counter log without the NVML sampler), so the cost of "on" splits into events,
record handling/writer, and NVML/GPM sampling.

Criteria (issue 6): throughput drop < 3 % for the ``gpu_bound`` stream; log times within
5 % of the event reference for its inputs. The ``host_bound`` numbers are reported as
the per-launch cost in microseconds (what logging every call costs when Python is the
bottleneck). Writes ``gpu_counterlog.json``, ``gpu_counterlog.png`` (from the log) and
the log itself (``gpu_counterlog.alog``) to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from adaptive.backends import resolve_name  # noqa: E402
from adaptive.counterlog import (CounterLog, Recorder, install_recorder, read_log,  # noqa: E402
                                 remove_recorder)
from adaptive.counterlog_cli import plot, summarise  # noqa: E402
from adaptive.dispatch import Dispatcher  # noqa: E402

# (op, shape(s), dtype) per stream and device
STREAMS = {
    "cuda": {
        "gpu_bound": [("softmax", [(8192, 2048)], "float32"),
                      ("softmax", [(16384, 2048)], "float16"),
                      ("gemm", [(2048, 2048), (2048, 2048)], "float16")],
        "host_bound": [("softmax", [(32, 256)], "float32"),
                       ("softmax", [(128, 1024)], "float16"),
                       ("gemm", [(64, 64), (64, 64)], "float16")],
    },
    "host": {
        "gpu_bound": [("softmax", [(512, 1024)], "float32"),
                      ("gemm", [(256, 256), (256, 256)], "float32"),
                      ("softmax", [(256, 2048)], "float32")],
        "host_bound": [("softmax", [(8, 64)], "float32"),
                       ("gemm", [(16, 16), (16, 16)], "float32"),
                       ("softmax", [(4, 256)], "float32")],
    },
}
DROP_LIMIT = 0.03
AGREE_LIMIT = 0.05


def make_inputs(device: str, spec, seed: int):
    rng = np.random.default_rng(seed)
    inputs = []
    for op, shapes, dtype in spec:
        host = [rng.standard_normal(s).astype(dtype) for s in shapes]
        if device == "cuda":
            import cupy
            host = [cupy.asarray(a) for a in host]
        inputs.append((op, tuple(host)))
    return inputs


class Clock:
    """Wall time of a block of launches, ended by a device synchronisation."""

    def __init__(self, d: Dispatcher):
        self.sync = getattr(d.backend, "synchronize", lambda: None)

    def time_s(self, fn) -> float:
        self.sync()
        t0 = time.perf_counter()
        fn()
        self.sync()
        return time.perf_counter() - t0


def reference_ms(d: Dispatcher, device: str, op: str, args, block: int) -> float:
    """Median per-launch time of ``block`` back-to-back launches, by CUDA events (host:
    wall clock), over 5 blocks."""
    times = []
    for _ in range(5):
        if device == "cuda":
            import cupy
            start, end = cupy.cuda.Event(), cupy.cuda.Event()
            start.record()
            for _ in range(block):
                d.launch(op, *args)
            end.record()
            end.synchronize()
            times.append(cupy.cuda.get_elapsed_time(start, end) / block)
        else:
            t0 = time.perf_counter()
            for _ in range(block):
                d.launch(op, *args)
            times.append((time.perf_counter() - t0) * 1e3 / block)
    return statistics.median(times)


def wait_idle(clog: CounterLog, timeout_s: float = 5.0) -> None:
    """Until every taken record is written (so an "off" round runs beside an idle writer)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not clog._queue and not any(t.pending for t in clog._timers.values()):
            break
        time.sleep(0.005)
    time.sleep(2 * clog.flush_interval_s)


class EventsOnly(Recorder):
    """An event pair from ``timer``'s ring around each launch, nothing else (attribution);
    with ``pairs=False`` only the end event."""

    def __init__(self, timer, pairs: bool = True):
        super().__init__()
        self.timer, self.pairs = timer, pairs

    def __call__(self, plan, args, out):
        t = self.timer
        slot = next(t.ticket) % t.capacity
        if t.busy[slot]:
            t.dropped += 1
            return self._next(plan, args, out)
        t.busy[slot] = True
        stream = t.current_stream().ptr
        if self.pairs:
            t.record(t.starts[slot], stream)
        result = self._next(plan, args, out)
        t.record(t.ends[slot], stream)
        t.append_pending((slot,))
        return result


def run_stream(name: str, d: Dispatcher, device: str, clog: CounterLog, args,
               events: dict[str, EventsOnly]) -> dict:
    inputs = make_inputs(device, STREAMS[device][name], seed=len(name))
    t0 = time.perf_counter()
    for op, xs in inputs:                     # decide, compile, warm
        for _ in range(3):
            d.launch(op, *xs)
    clock = Clock(d)
    warm_s = time.perf_counter() - t0
    n = args.launches

    def stream():
        for i in range(n):
            op, xs = inputs[i % len(inputs)]
            d.launch(op, *xs)

    clock.time_s(stream)                      # one untimed pass
    modes = ["off", "on"]
    if args.attribute:
        modes += ["log"] + list(events)
    rates = {mode: [] for mode in modes}
    samplers = list(clog.samplers.values())
    for r in range(args.rounds):
        order = modes[r % len(modes):] + modes[:r % len(modes)]
        for mode in (order if (r // len(modes)) % 2 == 0 else order[::-1]):
            if mode == "on":
                for s in samplers:
                    s.start()
            if mode in ("on", "log"):
                clog.attach(d)
            if mode in events:
                install_recorder(d, events[mode])
            rates[mode].append(n / clock.time_s(stream))
            if mode in events:
                remove_recorder(d, events[mode])
                timer = events[mode].timer      # all finished: the ring is free again
                timer.discard_pending()
                timer.busy[:] = [False] * timer.capacity
            if mode in ("on", "log"):
                clog.detach(d)
                for s in samplers:
                    s.stop()
                wait_idle(clog)
    med = {mode: statistics.median(v) for mode, v in rates.items()}
    off, on = med["off"], med["on"]
    result = {"stream": name, "launches_per_round": n, "rounds": args.rounds,
              "warm_s": round(warm_s, 3), "off_launches_per_s": off, "on_launches_per_s": on,
              "drop": 1 - on / off, "per_launch_cost_us": (1 / on - 1 / off) * 1e6,
              "off_rates": rates["off"], "on_rates": rates["on"],
              "attribution": {mode: {"launches_per_s": med[mode], "drop": 1 - med[mode] / off,
                                     "per_launch_cost_us": (1 / med[mode] - 1 / off) * 1e6,
                                     "rates": rates[mode]}
                              for mode in modes if mode != "off"}}
    result["inputs"] = [{"op": op, "shapes": [list(x.shape) for x in xs],
                         "dtype": str(xs[0].dtype),
                         "reference_ms": reference_ms(d, device, op, xs, args.ref_block)}
                        for op, xs in inputs]
    return result


def agreement(results: list[dict], records: list[dict]) -> None:
    """Attach the log's median time per input and its relative difference to each input."""
    for res in results:
        for inp in res["inputs"]:
            dims = [tuple(s) for s in inp["shapes"]]
            times = [r["time_ms"] for r in records if r["op"] == inp["op"]
                     and r["dtype"] == inp["dtype"] and _shape_match(r, dims)]
            inp["log_records"] = len(times)
            if times:
                inp["log_median_ms"] = statistics.median(times)
                inp["relative_difference"] = inp["log_median_ms"] / inp["reference_ms"] - 1


def _shape_match(record: dict, shapes: list[tuple]) -> bool:
    d = record["dims"]
    if record["op"] == "softmax":
        return (d.get("R"), d.get("C")) == shapes[0]
    if record["op"] == "gemm":
        return (d.get("M"), d.get("K")) == shapes[0] and (d.get("K"), d.get("N")) == shapes[1]
    return False


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=os.environ.get("OUT", "."), help="folder for the outputs")
    p.add_argument("--device", choices=("auto", "cuda", "host"), default="auto")
    p.add_argument("--launches", type=int, default=3000, help="launches per round")
    p.add_argument("--rounds", type=int, default=10, help="rounds per mode")
    p.add_argument("--ref-block", type=int, default=200, help="launches per reference block")
    p.add_argument("--quick", action="store_true", help="short run (dry run)")
    p.add_argument("--attribute", action=argparse.BooleanOptionalAction, default=True,
                   help="also time 'events' (event pairs only) and 'log' (no NVML) rounds")
    args = p.parse_args(argv)
    device = resolve_name(args.device)
    if args.device == "auto" and device != "cuda":
        print("gpu_counterlog: SKIP (no CUDA device; use --device host for a dry run)")
        return 0
    if args.quick:
        args.launches, args.rounds, args.ref_block = 600, 4, 50
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log_path = out / "gpu_counterlog.alog"
    d = Dispatcher(device)
    d.sample_every = 0                        # the dispatcher's own sampling off in both modes
    clog = CounterLog(log_path, sample_every=1, event_capacity=1 << 15,
                      nvml=device == "cuda").open()
    if device == "cuda":
        clog.attach(d)                        # creates the event ring and the NVML sampler
        clog.detach(d)
        for s in clog.samplers.values():
            s.stop()
    status = {i: {"nvml": s.status, "gpm": s.gpm_status, "refused": s.refused}
              for i, s in clog.samplers.items()}
    print(f"gpu_counterlog: {device}; samplers {status}", flush=True)
    events = {}
    if device == "cuda" and args.attribute:
        from profilers.events import EventTimer
        timer = EventTimer(args.launches + 16, d.backend.index)
        events = {"events": EventsOnly(timer), "events_end": EventsOnly(timer, pairs=False)}
    results = [run_stream(name, d, device, clog, args, events)
               for name in ("gpu_bound", "host_bound")]
    stats = clog.close()
    contents = read_log(log_path)
    agreement(results, contents.records)
    plot_path = out / "gpu_counterlog.png"
    plot(contents, str(plot_path))
    gpu = next(r for r in results if r["stream"] == "gpu_bound")
    checks = {"gpu_bound_drop_below_3pct": gpu["drop"] < DROP_LIMIT,
              "gpu_bound_log_within_5pct": all(
                  abs(i.get("relative_difference", 1.0)) < AGREE_LIMIT for i in gpu["inputs"]),
              "no_dropped_records": stats.dropped == 0}
    with_state = [r for r in contents.records if r.get("device_state")]
    payload = {"benchmark": "gpu_counterlog", "device": device,
               "fingerprint": d.backend.fingerprint(), "samplers": status,
               "log": {"records": len(contents.records), "written": stats.written,
                       "dropped": stats.dropped, "bytes": stats.bytes_written,
                       "with_device_state": len(with_state),
                       "device_state_example": with_state[-1]["device_state"] if with_state
                       else None},
              "summary": summarise(contents), "results": results, "checks": checks}
    tmp = out / f".gpu_counterlog.json.{os.getpid()}"
    tmp.write_text(json.dumps(payload, indent=2, default=str))
    os.replace(tmp, out / "gpu_counterlog.json")
    print("  attribution (against off; 'events': event pairs only, 'events_end': one event "
          "per launch, 'log': no NVML):")
    for r in results:
        for mode, a in r["attribution"].items():
            print(f"    {r['stream']:<11} {mode:<7} {a['launches_per_s']:>9.0f}/s  drop "
                  f"{a['drop']:+.2%}  cost {a['per_launch_cost_us']:+.2f} us/launch")
    print(f"  log: {stats.written} written, {stats.dropped} dropped, {stats.bytes_written} "
          f"bytes, {len(with_state)} with device state; plot {plot_path}")
    print(f"  checks: {checks}")
    print("  side by side (NVML sampling + logging of every call, against both off):")
    for r in results:
        print(f"  {r['stream']:<11} off {r['off_launches_per_s']:>9.0f}/s  on "
              f"{r['on_launches_per_s']:>9.0f}/s  drop {r['drop']:+.2%}  "
              f"cost {r['per_launch_cost_us']:+.2f} us/launch")
        for i in r["inputs"]:
            diff = i.get("relative_difference")
            print(f"      {i['op']:<8} {i['dtype']:<8} {str(i['shapes']):<26} event "
                  f"{i['reference_ms']:.4f} ms  log {i.get('log_median_ms', float('nan')):.4f} "
                  f"ms  ({'-' if diff is None else f'{diff:+.1%}'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
