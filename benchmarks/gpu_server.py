"""Serving benchmark through a real client: plain PyTorch vs adaptive vs static, side by side.

    PYTHONPATH=$PWD python3 benchmarks/gpu_server.py --out $OUT      # H200, about 4 minutes
    python benchmarks/gpu_server.py --device host --quick             # a dry run on the CPU

``scripts/gpu-check`` calls :func:`main` (``main(out_dir) -> list[dict]`` summary rows);
give it ``--bench-timeout-s 420``.

Each mode (``torch``: the Llama model with SDPA and plain ``nn.Linear``; ``adaptive``: the
same weights after ``adaptive.integrations.transformers.patch``; ``static``: adaptive
with every key pinned after warm-up) is served by examples/server/server.py in a process
of its own (the ``1b`` preset, float16; no state shared between modes, and the client's
threads never contend with the server's for one interpreter). The server warms up before
it listens (``--warmup``: each prompt length bucket at batch 1 and the largest batch, until
adaptive has no key left exploring); then the client warms it with a few seconds of the
load, untimed, and sends the same seeded closed-loop load at 8 and then 32 streaming
clients (loadgen.py: prompt lengths lognormal, median 128, clipped to 16..2048; 64 new
tokens each; each load serves the stream's first ``per_client`` x clients requests, the same
ones in every mode, so tokens/s and the per-token percentiles compare the same work (a
timed window served 56 requests in one mode and 64 in the other, 7 and 8 batches, and a
percentile over different batches compared different prompts); up to 32 requests
decoded together, prompts left-padded to a power-of-two width of at least 64 and batches
to a power-of-two rows, in every mode: the server's warm-up meets each of those shapes,
inside ``adaptive.unbounded_exploration()``). Each batch's longest prompt, prefill time,
step median and slow steps are printed under its load. Decision-cache misses inside the
loads are counted from /metrics, and adaptive's
exploration inside them is bounded by the learned policy's exploration budget.

Every mode's server is up at once, and each load's requests are split into ``--windows``
parts (2 by default), each part served by every mode in turn, the order alternating by
window; a mode's windows are pooled (tokens over seconds, percentiles over every
window's values). A slow phase of the host then falls on every mode's neighbouring
windows: with one window a mode, mode after mode, run S29's torch steps took 52 ms in its
first load and 17.8 ms in its second, against adaptive's 14.4-16.5. ``--windows 1`` runs
the modes one after another, each server closed before the next starts (and so does the
dry run, whose servers share this process's runtime).
An NVML sampler reads SM activity and clocks while the load runs.

Writes ``gpu_server.json`` to ``--out`` and prints, last, a table per mode and client
count (req/s, tokens/s, time to first token, per-token p50/p99, SM activity) and each
mode's ratios against torch beside the issue's bar (tokens/s >= 0.98x, per-token p99 <=
1.05x). ``--device host`` (or ``--quick``) serves the ``tiny`` preset from threads of this
process for a second per load: a dry run of the code paths, not a measurement.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import re
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SERVER_DIR = ROOT / "examples" / "server"
sys.path.insert(0, str(ROOT))                        # profilers, when run as a script
sys.path.insert(0, str(SERVER_DIR))

from loadgen import make_stream, percentiles, pool, run_load  # noqa: E402

MODES = ("torch", "adaptive", "static")
CONCURRENCY = (8, 32)
TARGETS = {"tokens_per_s": 0.98, "token_p99": 1.05}       # issue 12: adaptive / torch
SERVE_DEPS = ("starlette", "uvicorn", "transformers", "torch")
SLOW_PREFILL_MS = 100.0   # a batch whose first tokens took this long: its stacks printed


class DeviceSampler:
    """NVML snapshots every ``period_s`` on a thread, kept per phase (None without NVML)."""

    def __init__(self, enabled: bool = True, period_s: float = 0.1):
        self.period_s, self.snapshots = period_s, []
        self._stop = threading.Event()
        self._thread = None
        self.nvml, self.status = None, "off (host)"
        if not enabled:
            return
        try:
            from profilers.nvml import NvmlSampler
            self.nvml = NvmlSampler(0, period_s=period_s, gpm_period_s=0.2)
            self.status = f"nvml {self.nvml.status}, gpm {self.nvml.gpm_status}"
        except Exception as exc:  # noqa: BLE001 (no profilers package or no NVML)
            self.nvml, self.status = None, f"no sampler: {type(exc).__name__}: {exc}"

    def __enter__(self):
        self.snapshots, self._stop = [], threading.Event()
        if self.nvml is not None and self.nvml.status == "ok":
            self._thread = threading.Thread(target=self._loop, daemon=True)
            self._thread.start()
        return self

    def _loop(self):
        while not self._stop.wait(self.period_s):
            snap = self.nvml.sample_once()
            if snap is not None:
                self.snapshots.append(snap.to_dict())

    def __exit__(self, *exc):
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def summary(self) -> dict:
        return sampler_summary([self.snapshots])


def sampler_summary(windows: list[list[dict]]) -> dict:
    """The mean of each counter over the snapshots of one or more sampled windows (each
    window's first two left out: GPM's first reading covers the time before it)."""
    snaps = [s for w in windows for s in w[2:]]
    out = {"samples": sum(len(w) for w in windows)}
    for field in ("sm_active_ratio", "sm_occupancy_ratio", "tensor_active_ratio",
                  "sm_clock_mhz", "power_w", "gpu_util_ratio"):
        values = [s[field] for s in snaps if field in s]
        if values:
            out[field] = float(np.mean(values))
    return out


# ---- one server per mode ----------------------------------------------------------------
class Subprocess:
    """server.py in a child process; its output goes to ``log_path``."""

    def __init__(self, argv: list[str], log_path: Path, start_timeout_s: float):
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
        self.log_path = log_path
        self.log = open(log_path, "w")
        self.proc = subprocess.Popen([sys.executable, str(SERVER_DIR / "server.py"), *argv],
                                     stdout=subprocess.PIPE, stderr=self.log, text=True,
                                     cwd=ROOT, env=env)
        lines: queue.Queue = queue.Queue()
        self._pumping = threading.Thread(target=self._pump, args=(lines,), daemon=True)
        self._pumping.start()
        deadline = time.monotonic() + start_timeout_s
        while True:
            try:
                line = lines.get(timeout=max(deadline - time.monotonic(), 0.01))
            except queue.Empty:
                self.close()
                raise RuntimeError(f"the server did not start in {start_timeout_s:.0f} s: "
                                   f"{self.tail()}") from None
            if line is None:
                self.close()
                raise RuntimeError(f"the server exited before serving: {self.tail()}")
            if line.startswith("serving "):
                self.url = line.split()[-1]
                return

    def _pump(self, lines: queue.Queue) -> None:
        for line in self.proc.stdout:
            self.log.write(line)
            self.log.flush()
            lines.put(line.strip())
        lines.put(None)

    def tail(self, n: int = 1500) -> str:
        if not self.log.closed:   # (closed by a start that failed: run S69 lost its reason
            self.log.flush()      # to "I/O operation on closed file")
        return self.log_path.read_text()[-n:]

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self._pumping.join(10)    # the child gone: its output's end reached
        if not self._pumping.is_alive():
            self.proc.stdout.close()
        self.log.close()


class InProcess:
    """server.py's ServerThread (the dry run: no second interpreter to start)."""

    def __init__(self, argv: list[str]):
        from server import ServerThread
        self.server = ServerThread(argv)
        self.url = self.server.url

    def close(self) -> None:
        self.server.close()


def fetch_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=30) as resp:
        return json.loads(resp.read())


def decision_misses(url: str) -> int | None:
    """The server's adaptive decision-cache misses (all backends) from /metrics."""
    try:
        with urllib.request.urlopen(url + "/metrics", timeout=30) as resp:
            text = resp.read().decode()
    except OSError:
        return None
    found = re.findall(r"^adaptive_decision_cache_misses_total\{[^}]*\} (\S+)$", text, re.M)
    return int(sum(float(v) for v in found))


class ModeRun:
    """One mode's server through a run: started (the server's warm-up, then the client's),
    its windows of each load, then one prefill profiled and the server closed.

    A load's windows are pooled by :meth:`loads`: tokens and seconds added, percentiles
    over every window's values. With several windows a load is served in turns by every
    mode (:func:`run`), so a slow phase of the host (run S29: torch's first batches
    stepped at 52-55 ms, its later one at 17.8) falls on all modes' neighbouring windows,
    where one window per mode, mode after mode, laid it on whichever mode ran then."""

    def __init__(self, mode: str, args: argparse.Namespace, stream, out: Path):
        base, graphs = split_mode(mode)
        argv = ["--mode", base, "--preset", args.preset, "--device", args.device,
                "--max-batch", str(args.max_batch), "--max-tokens-limit", str(args.max_tokens),
                "--warmup", "--warmup-limit-s", str(args.warmup_limit_s), "--max-queued",
                "4096", "--pad-to", "64", "--shape-buckets", "pow2"]   # the same shapes
        argv += list(getattr(args, "server_args", ()))
        if base == "adaptive":
            argv += list(getattr(args, "adaptive_args", ()))
        # every mode says how it decodes (the server's default, auto, captures on CUDA)
        argv += ["--decode-graphs", ("eager" if args.in_process else "on") if graphs
                 else "off"]
        if args.in_process:   # the dry run: short warm-up, one CPU thread (shared CI machines)
            argv += ["--warmup-lengths", "16,48", "--torch-threads", "1"]
        self.mode, self.args = mode, args
        t0 = time.perf_counter()
        self.server = (InProcess(argv) if args.in_process
                       else Subprocess(["--port", "0", *argv], out / f"server-{mode}.log",
                                       args.start_timeout_s))
        self.result = {"mode": mode, "start_s": time.perf_counter() - t0, "loads": {}}
        self.windows: dict[str, list[dict]] = {}
        self.outputs: dict[str, dict] = {}   # per load: request -> its greedy token ids
        try:
            self.result["server"] = fetch_json(self.server.url + "/stats")
            warm = self.result["server"].get("warmup", {})
            sweep = self.result["server"].get("attention_sweep")
            swept = (f"; decode attention swept: {sweep['classes']} classes in "
                     f"{sweep['sweep_s']:.1f} s, {sweep['undecided']} undecided, "
                     f"{sweep.get('skipped', 0)} past its time limit"
                     if sweep else "")
            print(f"  {mode}: serving after {self.result['start_s']:.1f} s (warm-up "
                  f"{warm.get('warmup_s', 0):.1f} s in {warm.get('rounds', 0)} rounds, "
                  f"{_f(warm.get('pending_keys'), 'd')} key(s) still exploring{swept})",
                  flush=True)
            static = self.result["server"].get("decode_graphs")
            if static:
                states = static["states"]
                print(f"  {mode}: decode steps {static['mode']} over {len(states)} static "
                      f"cache(s) (rows x length: " + ", ".join(
                          f"{g['rows']}x{g['length']}" for g in states) + f"); "
                      f"{sum(g['captured'] for g in states)} captured in "
                      f"{sum(g['capture_s'] or 0 for g in states):.1f} s", flush=True)
                for g in states:
                    if g.get("capture_error"):
                        print(f"  {mode}: capture FAILED for {g['rows']}x{g['length']}, its "
                              f"steps uncaptured: {g['capture_error'][:400]}", flush=True)
            client_warm = run_load(self.server.url, stream, max(args.concurrency),
                                   args.client_warmup_s)
            self.result["client_warmup"] = {"ok": client_warm.ok,
                                            "errors": client_warm.errors}
            self.misses = decision_misses(self.server.url)
            self.activity = fetch_json(self.server.url + "/stats").get("adaptive_policy", {})
        except BaseException:
            self.server.close()
            raise

    def window(self, clients: int, requests: list, sampler: DeviceSampler,
               label: str = "") -> None:
        """Serve ``requests`` with ``clients`` streaming clients (cut at the run's
        duration) and keep what the window measured, the server's side included."""
        t_load = time.time()
        with sampler:
            report = run_load(self.server.url, requests, clients, self.args.duration_s)
        t_end = time.time()
        after = decision_misses(self.server.url)
        stats = fetch_json(self.server.url + "/stats")
        now = stats.get("adaptive_policy", {})
        w = {"report": report, "snapshots": list(sampler.snapshots), "span": (t_load, t_end),
             "requests": len(requests),
             "misses": None if self.misses is None or after is None else after - self.misses,
             "miss_list": [m for m in stats.get("adaptive_misses", [])
                           if m["time_s"] >= t_load],
             "policy": {k: now[k] - self.activity.get(k, 0) for k in now},
             "batches": [b for b in stats.get("engine_batches", [])
                         if t_load <= b["start_s"] <= t_end],
             "batches_complete": len(stats.get("engine_batches", [])) < 512,
             "misses_complete": all(
                 sum(m["how"] == how for m in stats.get("adaptive_misses", [])) < 256
                 for how in ("decided", "class"))}
        self.misses, self.activity = after, now
        self.windows.setdefault(str(clients), []).append(w)
        cut = "" if report.ok == len(requests) else \
            f" (CUT: {report.ok} of {len(requests)} requests served within " \
            f"{self.args.duration_s:g} s)"
        print(f"  {self.mode} x{clients}{label}: {report.line()}{cut}", flush=True)

    def loads(self) -> dict:
        """Each client count's windows pooled into one load (the JSON's ``loads``), with
        its lines printed."""
        for clients, ws in self.windows.items():
            report = pool([w["report"] for w in ws])
            load = report.to_dict() | {
                "device": sampler_summary([w["snapshots"] for w in ws]),
                "requests": sum(w["requests"] for w in ws), "windows": len(ws),
                "misses_in_load": (None if any(w["misses"] is None for w in ws)
                                   else sum(w["misses"] for w in ws))}
            load["miss_breakdown"] = miss_breakdown([m for w in ws for m in w["miss_list"]],
                                                    all(w["misses_complete"] for w in ws))
            load["policy"] = {k: sum(w["policy"].get(k, 0) for w in ws)
                              for k in ws[-1]["policy"]}
            batches = [b for w in ws for b in w["batches"]]
            load["engine"] = engine_breakdown(batches, [w["span"] for w in ws],
                                              all(w["batches_complete"] for w in ws),
                                              [m for w in ws for m in w["miss_list"]])
            self.result["loads"][clients] = load
            self.outputs[clients] = report.samples.get("outputs", {})
            self._print(clients, load, report, len(ws))
        return self.result["loads"]

    def _print(self, clients: str, load: dict, report, n_windows: int) -> None:
        mode = self.mode
        if n_windows > 1:
            print(f"  {mode} x{clients} ({n_windows} windows pooled): {report.line()}",
                  flush=True)
        print(f"  {mode} x{clients} engine: {engine_line(load['engine'])}", flush=True)
        for i, b in enumerate(load["engine"]["per_batch"]):
            inside = ", ".join(f"{how} {n} in {ms:.1f} ms"
                               for how, (n, ms) in b["prefill_misses"].items()) or "none"
            print(f"    batch {i}: {b['requests']} requests, longest prompt "
                  f"{b['longest']}, prefill {_f(b['first_ms'], '.1f')} ms (CPU: engine "
                  f"thread {_f(b['first_cpu_ms'], '.1f')}, process "
                  f"{_f(b['first_process_cpu_ms'], '.1f')} ms; garbage collection "
                  f"{_f(b['first_gc_ms'], '.1f')} ms; misses {inside}), {b['steps']} "
                  f"steps p50 {_f(b['step_p50_ms'], '.2f')} max "
                  f"{_f(b['step_max_ms'], '.2f')} ms, {b['n_slow']} slow: "
                  + ", ".join(f"#{k} {v:.1f}" for k, v in b["slow_steps"].items()),
                  flush=True)
            if (b["first_ms"] or 0) >= SLOW_PREFILL_MS:   # where its engine thread was
                for line in b["first_stacks"][:3]:
                    print(f"      prefill stack: {line}", flush=True)
        if load["policy"]:
            a = load["policy"]
            print(f"  {mode} x{clients} policy: {a['refits']} model refit(s), "
                  f"{a['refit_s']:.2f} s fitting; {a['explore_calls']} exploring calls, "
                  f"{a['explore_s']:.3f} s; {a['commits']} commit(s), {a['drifts']} "
                  f"drift(s), {a['deferred']} class(es) deferred; {a['races']} "
                  f"F.linear race(s), {a['race_s']:.3f} s", flush=True)
        if load["miss_breakdown"]["misses"]:
            print(f"  {mode} x{clients} misses: {miss_line(load['miss_breakdown'])}",
                  flush=True)

    def finish(self, stream) -> dict:
        """One prefill profiled, the server's last stats, the server closed."""
        try:
            self.result["prefill_profile"] = profile_one_batch(
                self.server.url, stream, min(self.args.concurrency))
            for line in self.result["prefill_profile"]:
                print(f"  {self.mode} profile: {line}", flush=True)
            self.result["server"] = fetch_json(self.server.url + "/stats")
            static = self.result["server"].get("decode_graphs") or {}
            if static.get("recheck_every"):
                states = static["states"]
                print(f"  {self.mode}: decode re-checks every {static['recheck_every']} "
                      f"batches of a state: {sum(g['rechecks'] for g in states)} re-checks, "
                      f"{sum(g['recaptures'] for g in states)} re-captures over "
                      f"{sum(g['batches'] for g in states)} captured batches", flush=True)
        finally:
            self.server.close()
        return self.result


def profile_one_batch(url: str, stream, clients: int) -> list[str]:
    """After the timed loads: the stream's first ``clients`` requests once more (one batch,
    untimed), its prefill and one decode step under torch.profiler in the server; each
    profile's summary, top kernels by device time, SDPA's calls with the fused backends that
    take them, the way each patched layer went, and the Python functions with the most
    time of their own."""
    body = json.dumps({"batches": 1}).encode()
    req = urllib.request.Request(url + "/debug/profile-prefill", body,
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        json.loads(resp.read())
    run_load(url, stream[:clients], clients, 120.0)
    profiles = fetch_json(url + "/stats").get("prefill_profiles", [])
    if not profiles:
        return ["no prefill profiled"]
    batch = profiles[-1]["batch"]
    lines = []
    for p in (p for p in profiles if p["batch"] == batch):   # its prefill, a decode step
        what = p.get("what", "prefill")
        lines += [f"{what}: batch {p['batch']}: wall {p['wall_ms']:.1f} ms (the forward "
                  f"issued in {p['issue_ms']:.1f}), device {p['device_ms']:.1f} ms, host "
                  f"{p['host_ms']:.1f} ms"] + [
            f"{what}: {line}" for line in p["top"][:10]] + [
            f"{what}: SDPA {line}" for line in p.get("sdpa", [])] + [
            f"{what}: route {line}" for line in p.get("routes", [])] + [
            f"{what}: host {line}" for line in p.get("host_top", [])[:6]] + [
            f"{what}: stack {line}" for line in p["python"][:8]]
    return lines


def miss_breakdown(mine: list[dict], complete: bool) -> dict:
    """The server's misses of a load: how many by op and kind ("class": a plan prepared
    from its input class's decision; "decided": the policy decided), the ms they spent
    (deciding and preparing) and of them preparing the plans, and the inputs of the
    costliest few. ``complete``: whether ``mine`` holds every miss of the load (the server
    keeps its newest 256 of each kind)."""
    by: dict[str, list] = {}
    for m in mine:
        by.setdefault(f"{m['op']}/{m['how']}", []).append(m)
    worst = sorted(mine, key=lambda m: -m["ms"])[:5]
    return {"misses": len(mine), "ms": round(sum(m["ms"] for m in mine), 2),
            "by": {k: {"n": len(v), "ms": round(sum(m["ms"] for m in v), 2),
                       "max_ms": max(m["ms"] for m in v),
                       "prepare_ms": round(sum(m["prepare_ms"] for m in v), 2)}
                   for k, v in sorted(by.items())},
            "worst": [f"{m['op']} {m['input']} ({m['how']}, {m['ms']:.2f} ms)" for m in worst],
            "complete": complete}


def engine_breakdown(batches: list[dict], windows: list[tuple[float, float]],
                     complete: bool | None = None, misses: list[dict] = ()) -> dict:
    """The server engine's batches that started in one of ``windows`` ((since, until)
    each, ``time.time()``): how many, requests a batch, the first request's queue wait,
    the time to first tokens (prefill), the steps between tokens (p50, p99: the engine's
    own per-token time; a client's per-token latency above it is delivery), and the
    fraction of the windows' time a batch was running (each counted to its window's end).
    ``complete``: whether ``batches`` holds every batch of the windows (None: the engine
    keeps its newest 512). ``misses``: the server's misses of the windows, each counted
    in the prefill it fell in."""
    ends = [(b, until) for b in batches for since, until in windows
            if since <= b["start_s"] <= until]
    mine = [b for b, _ in ends]
    steps = [t for b in mine for t in b["steps_ms"]]

    def pct(values, q):
        return percentiles(values)[q] if values else None
    span = sum(until - since for since, until in windows)
    busy = sum(min(b["end_s"], until) - b["start_s"] for b, until in ends)
    return {"batches": len(mine),
            "requests_per_batch": (sum(b["requests"] for b in mine) / len(mine)
                                   if mine else None),
            "wait_p50_ms": pct([b["wait_ms"] for b in mine], "p50"),
            "first_p50_ms": pct([b["first_ms"] for b in mine if b["first_ms"] is not None],
                                "p50"),
            "step_p50_ms": pct(steps, "p50"), "step_p99_ms": pct(steps, "p99"),
            "busy": busy / span if span > 0 else None,
            "complete": len(batches) < 512 if complete is None else complete,
            "per_batch": [batch_line(b, misses) for b in mine]}


def batch_line(b: dict, misses: list[dict] = ()) -> dict:
    """One batch: its requests, longest prompt, prefill ms, the CPU ms of the engine's
    thread and of the process over the prefill, the misses that fell in the prefill (by
    kind: count and ms), steps, step p50 and max, and where its slow steps fell (more than
    twice its median: a miss, a collection, a co-running process show up at a few steps; a
    long prompt slows every step)."""
    steps = b["steps_ms"]
    p50 = float(np.median(steps)) if steps else None
    slow = [i for i, t in enumerate(steps) if p50 and t > 2 * p50]
    inside: dict[str, list] = {}
    if b["first_ms"] is not None:
        end = b["start_s"] + b["first_ms"] / 1e3
        for m in misses:
            if b["start_s"] <= m["time_s"] <= end:
                n_ms = inside.setdefault(m["how"], [0, 0.0])
                n_ms[0] += 1
                n_ms[1] = round(n_ms[1] + m["ms"], 3)
    return {"requests": b["requests"], "longest": b.get("longest"), "first_ms": b["first_ms"],
            "first_cpu_ms": b.get("first_cpu_ms"),
            "first_process_cpu_ms": b.get("first_process_cpu_ms"),
            "first_gc_ms": b.get("first_gc_ms"),
            "first_stacks": b.get("first_stacks", []),
            "prefill_misses": inside,
            "steps": len(steps), "step_p50_ms": p50, "step_max_ms": max(steps, default=None),
            "slow_steps": {str(i): steps[i] for i in slow[:8]}, "n_slow": len(slow)}


def engine_line(e: dict) -> str:
    if not e["batches"]:
        return "no batch started in the window"
    return (f"{e['batches']} batches of {e['requests_per_batch']:.1f} requests, busy "
            f"{e['busy']:.0%} of the window; first request's wait p50 "
            f"{_f(e['wait_p50_ms'], '.1f')} ms, first tokens p50 "
            f"{_f(e['first_p50_ms'], '.1f')} ms, step p50/p99 "
            f"{_f(e['step_p50_ms'], '.2f')}/{_f(e['step_p99_ms'], '.2f')} ms"
            + ("" if e["complete"] else " (the newest 512 batches only)"))


def miss_line(b: dict) -> str:
    parts = ", ".join(f"{k} {v['n']} ({v['ms']:.1f} ms, preparing {v['prepare_ms']:.1f}; max "
                      f"{v['max_ms']:.2f})" for k, v in b["by"].items())
    return (f"{b['misses']} in {b['ms']:.1f} ms: {parts}; costliest: "
            + "; ".join(b["worst"][:3])
            + ("" if b["complete"] else " (the newest 256 of each kind only)"))


def check_deps() -> str | None:
    import importlib.util
    missing = [m for m in SERVE_DEPS if importlib.util.find_spec(m) is None]
    if missing:
        return (f"missing {', '.join(missing)}: pip install adaptive-dispatch[serve,llm] "
                "(or put them on PYTHONPATH)")
    return None


def serve(modes, args: argparse.Namespace, stream, sampler: DeviceSampler, out: Path,
          windows: int, greedy: list | None = None) -> list[dict]:
    """Every mode's results. One window: each mode's server started, its loads served and
    the server closed before the next mode's starts. Several: every mode's server
    started (one after another, each warming up alone), then each load's requests split
    into ``windows`` consecutive parts, each part served by every mode in turn (the order
    alternating by window) and the windows pooled per mode. A mode that fails is reported
    and the others go on. ``greedy``: a list to extend with :func:`greedy_agreement`'s rows
    over the modes that finished."""
    results: dict[str, dict] = {}
    runs: dict[str, ModeRun] = {}
    outputs: dict[str, dict] = {}
    missing = check_deps()

    def failed(mode, exc, run=None):
        if run is not None:
            run.server.close()
            runs.pop(mode, None)
        results[mode] = {"mode": mode, "error": f"{type(exc).__name__}: {exc}"[:1500]}
        print(f"  {mode}: FAILED {results[mode]['error']}", flush=True)

    def start(mode):
        try:
            if missing:
                raise RuntimeError(missing)
            runs[mode] = ModeRun(mode, args, stream, out)
        except Exception as exc:  # noqa: BLE001 (one mode failing still reports the others)
            failed(mode, exc)

    def loads(mode, order_of_windows):
        run = runs.get(mode)
        if run is None:
            return
        try:
            for clients in args.concurrency:
                parts = split(stream[:args.per_client * clients], windows)
                for w in order_of_windows:
                    run.window(clients, parts[w], sampler,
                               f" window {w + 1}/{windows}" if windows > 1 else "")
        except Exception as exc:  # noqa: BLE001
            failed(mode, exc, run)

    def finish(mode, t0):
        run = runs.pop(mode, None)
        if run is None:
            return
        try:
            run.loads()
            results[mode] = run.finish(stream)
            outputs[mode] = run.outputs
        except Exception as exc:  # noqa: BLE001
            failed(mode, exc, run)
        print(f"  {mode}: {time.perf_counter() - t0:.1f} s", flush=True)

    if windows == 1:
        for mode in modes:
            t0 = time.perf_counter()
            start(mode)
            loads(mode, [0])
            finish(mode, t0)
    else:
        t0 = time.perf_counter()
        for mode in modes:
            start(mode)
        for clients in args.concurrency:
            parts = split(stream[:args.per_client * clients], windows)
            for w in range(windows):
                for mode in (modes if w % 2 == 0 else modes[::-1]):
                    run = runs.get(mode)
                    if run is None:
                        continue
                    try:
                        run.window(clients, parts[w], sampler, f" window {w + 1}/{windows}")
                    except Exception as exc:  # noqa: BLE001
                        failed(mode, exc, run)
        for mode in modes:
            finish(mode, t0)
    if greedy is not None:
        greedy.extend(greedy_agreement(outputs))
    return [results[m] for m in modes if m in results]


SAME_TOKENS = 32   # greedy tokens compared between modes (as gpu_generate.py does)


def greedy_agreement(outputs: dict, first: int = SAME_TOKENS) -> list[dict]:
    """Per load and pair of modes: of the requests both served, how many streamed the same
    first ``first`` greedy tokens, and where the others first differed (a token index).
    ``outputs``: mode -> load -> request -> token ids. With random weights, fp16 sums
    computed in another order break near-tied logits the other way (gpu_generate.py
    compares the first step's logits), so a pair of plain-PyTorch modes is the control."""
    rows = []
    modes = list(outputs)
    for i, a in enumerate(modes):
        for b in modes[i + 1:]:
            for clients in outputs[a]:
                mine, theirs = outputs[a][clients], outputs[b].get(clients, {})
                both = [q for q in mine if q in theirs]
                diff = []
                for q in both:
                    x, y = mine[q][:first], theirs[q][:first]
                    if x != y:
                        diff.append(next((j for j, (u, v) in enumerate(zip(x, y)) if u != v),
                                         min(len(x), len(y))))
                rows.append({"clients": int(clients), "modes": [a, b], "requests": len(both),
                             "same": len(both) - len(diff), "first_differences": sorted(diff)})
    return rows


def greedy_lines(rows: list[dict], first: int = SAME_TOKENS) -> list[str]:
    return [f"greedy tokens (first {first}) at {r['clients']} clients: {r['modes'][0]} = "
            f"{r['modes'][1]} on {r['same']}/{r['requests']} requests"
            + (f"; the others first differ at token {', '.join(map(str, r['first_differences']))}"
               if r["first_differences"] else "") for r in rows]


def split(requests: list, parts: int) -> list[list]:
    """``requests`` in ``parts`` consecutive parts of (nearly) equal size."""
    n = len(requests)
    return [requests[n * i // parts: n * (i + 1) // parts] for i in range(parts)]


def start_timeout_s(warmup_limit_s: float) -> float:
    """How long a server may take to start: building the model (and pruning it), the
    decode-attention sweep (its own limit, 120 s), and a warm-up that checks its limit from
    its second round on, so it can run two rounds past it. Run S69: the adaptive 2:4 server
    swept for 47.9 s and took 91.6 s for its first round, and 240 s were not enough."""
    return 150.0 + 3 * warmup_limit_s


GRAPHS = "+graphs"   # a mode's suffix: its server decodes in CUDA graphs


def split_mode(mode: str) -> tuple[str, bool]:
    """A benchmark mode's server mode and whether its decode steps run over static caches
    in CUDA graphs (``adaptive+graphs``, ``torch-nocudnn+graphs``: ``--decode-graphs on``,
    ``eager`` in a dry run). A plain-PyTorch user can capture decode steps as well (what
    ``torch.compile``'s reduce-overhead mode and transformers' static cache do), so a mode
    with graphs is compared with a plain mode with graphs."""
    base, graphs = (mode[:-len(GRAPHS)], True) if mode.endswith(GRAPHS) else (mode, False)
    if not base or "+" in base:
        raise ValueError(f"a mode is a server mode, optionally with {GRAPHS!r}; got {mode!r}")
    return base, graphs


def run(out_dir: str, device: str = "auto", modes=MODES, concurrency=CONCURRENCY,
        duration_s: float = 120.0, quick: bool = False, preset: str | None = None,
        max_tokens: int = 64, client_warmup_s: float = 6.0, warmup_limit_s: float = 90.0,
        max_batch: int = 32, requests: int = 20000, server_args: tuple = (),
        adaptive_args: tuple = (),
        prompt_max: int = 2048, min_tokens: int | None = None,
        json_name: str = "gpu_server.json", per_client: int = 8, windows: int = 2) -> dict:
    """Every mode on one request stream; writes ``json_name``; returns the payload.
    Each load serves the stream's first ``per_client`` x clients requests (8: 8 batches
    at 8 clients) and is cut at ``duration_s`` (a cut load says so: ok < requests).
    ``server_args``: more server arguments for every mode (``--prune 2:4``);
    ``adaptive_args``: more for the adaptive modes only (``--graphs-recheck-every 8``);
    ``prompt_max``
    and ``min_tokens``: the stream's longest prompt and fewest new tokens (None: every
    request ``max_tokens``). A mode named with ``+graphs`` (``adaptive+graphs``) decodes
    over static caches in CUDA graphs (:func:`split_mode`)."""
    for mode in modes:
        split_mode(mode)
    if per_client < 1:
        raise ValueError(f"per_client must be at least 1, got {per_client}")
    if not 1 <= windows <= per_client:
        raise ValueError(f"windows must be from 1 to per_client ({per_client}): each window "
                         f"serves at least one request per client; got {windows}")
    from server import resolve_device
    device = resolve_device("auto" if device == "auto" else
                            "cpu" if device == "host" else device)
    dry = quick or device == "cpu"
    args = argparse.Namespace(
        device=device, preset=preset or ("tiny" if dry else "1b"),
        concurrency=tuple(concurrency) if not dry else (2, 4),
        duration_s=min(duration_s, 1.0) if dry else duration_s,
        per_client=min(per_client, 2) if dry else per_client,
        max_tokens=4 if dry else max_tokens, client_warmup_s=0.5 if dry else client_warmup_s,
        warmup_limit_s=min(warmup_limit_s, 1.0) if dry else warmup_limit_s,
        max_batch=4 if dry else max_batch,
        start_timeout_s=start_timeout_s(warmup_limit_s), in_process=dry,
        server_args=tuple(server_args), adaptive_args=tuple(adaptive_args))
    prompt_max = 64 if dry else prompt_max
    min_tokens = None if dry or min_tokens is None else min_tokens
    stream = make_stream(requests, seed=0, rate=0.0, prompt_median=16 if dry else 128,
                         prompt_sigma=1.0, prompt_min=min(16, prompt_max),
                         prompt_max=prompt_max, max_tokens=args.max_tokens,
                         min_tokens=min_tokens)
    sampler = DeviceSampler(enabled=device.startswith("cuda"))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    print(f"gpu_server: {device}, preset {args.preset}, clients {args.concurrency}, "
          f"{args.per_client} requests per client each load (cut at {args.duration_s:g} s) "
          f"in {1 if dry else windows} window(s) a mode, the modes taking turns, "
          f"{'' if min_tokens is None else f'{min_tokens}..'}{args.max_tokens} new tokens, "
          f"{' '.join(args.server_args) or 'no server options'}"
          f"{' (adaptive: ' + ' '.join(args.adaptive_args) + ')' if args.adaptive_args else ''}"
          f", prompts up to {prompt_max}, "
          f"{percentiles([r.prompt_len for r in stream[:2000]])['p50']:.0f} median tokens; "
          f"sampler: {sampler.status}", flush=True)
    # servers in this process (the dry run) share one runtime: their policy counters would
    # mix if they were up at once, so they serve one after another, in one window each
    greedy: list[dict] = []
    results = serve(modes, args, stream, sampler, out, 1 if args.in_process else windows,
                    greedy)
    for line in greedy_lines(greedy):
        print(f"  {line}", flush=True)
    payload = {"benchmark": "gpu_server", "device": device, "preset": args.preset,
               "concurrency": list(args.concurrency), "duration_s": args.duration_s,
               "per_client": args.per_client, "windows": windows,
               "max_tokens": args.max_tokens, "min_tokens": min_tokens,
               "prompt_max": prompt_max, "server_args": list(args.server_args),
               "adaptive_args": list(args.adaptive_args),
               "max_batch": args.max_batch, "sampler": sampler.status, "results": results,
               "greedy": greedy}
    tmp = out / f".{json_name}.{os.getpid()}"
    tmp.write_text(json.dumps(payload, indent=2, default=str))
    os.replace(tmp, out / json_name)
    return payload


def _ratio(x, y):
    return None if x is None or not y else x / y


def ratios(a: dict, b: dict) -> dict:
    """Mode ``a``'s load against mode ``b``'s (one client count): higher-is-better for
    throughput, lower-is-better for latencies."""
    return {"tokens_per_s": _ratio(a["tokens_per_s"], b["tokens_per_s"]),
            "rps": _ratio(a["throughput_rps"], b["throughput_rps"]),
            "ttft_p99": _ratio(a["ttft_ms"].get("p99"), b["ttft_ms"].get("p99")),
            "token_p50": _ratio(a["token_ms"].get("p50"), b["token_ms"].get("p50")),
            "token_p99": _ratio(a["token_ms"].get("p99"), b["token_ms"].get("p99"))}


def _f(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def table(payload: dict) -> str:
    w = max([13] + [len(r["mode"]) for r in payload["results"]])
    head = (f"{'mode':<{w}} {'clients':>7} {'req/s':>8} {'tok/s':>9} {'TTFT p50':>9} "
            f"{'TTFT p99':>9} {'tok p50':>8} {'tok p99':>8} {'ok/sent':>11} {'misses':>6} "
            f"{'SM act':>7}")
    lines = [head, "-" * len(head)]
    by_mode = {}
    for r in payload["results"]:
        if "error" in r:
            lines.append(f"{r['mode']:<{w}} failed: {r['error'][:300]}")
            continue
        by_mode[r["mode"]] = r
        for clients, load in r["loads"].items():
            lines.append(
                f"{r['mode']:<{w}} {clients:>7} {load['throughput_rps']:>8.2f}"
                f" {load['tokens_per_s']:>9.1f} {_f(load['ttft_ms'].get('p50'), '.1f'):>9}"
                f" {_f(load['ttft_ms'].get('p99'), '.1f'):>9}"
                f" {_f(load['token_ms'].get('p50'), '.2f'):>8}"
                f" {_f(load['token_ms'].get('p99'), '.2f'):>8} {load['ok']:>5}/{load['sent']:<5}"
                f" {_f(load.get('misses_in_load'), 'd'):>6}"
                f" {_f(load['device'].get('sm_active_ratio'), '.2f'):>7}")
    for mode, torch_mode in against_torch(by_mode):
        base = by_mode[torch_mode]
        for clients, load in by_mode[mode]["loads"].items():
            if clients not in base["loads"]:
                continue
            x = ratios(load, base["loads"][clients])
            met = x["tokens_per_s"] is not None and x["token_p99"] is not None and \
                x["tokens_per_s"] >= TARGETS["tokens_per_s"] and \
                x["token_p99"] <= TARGETS["token_p99"]
            lines.append(
                f"{mode} / {torch_mode} at {clients:>2} clients: tokens/s "
                f"{_f(x['tokens_per_s'], '.3f')}x, "
                f"req/s {_f(x['rps'], '.3f')}x, per-token p50 {_f(x['token_p50'], '.3f')}x, "
                f"p99 {_f(x['token_p99'], '.3f')}x, TTFT p99 {_f(x['ttft_p99'], '.3f')}x   "
                f"(bar: tokens/s >= {TARGETS['tokens_per_s']}x, per-token p99 <= "
                f"{TARGETS['token_p99']}x: {'met' if met else 'NOT met'})")
    return "\n".join(lines)


def against_torch(by_mode: dict) -> list[tuple[str, str]]:
    """(mode, the torch mode it is compared with): adaptive and static against torch, each
    decoding the same way (a mode with ``+graphs`` against ``torch+graphs``)."""
    pairs = []
    for mode in by_mode:
        base, graphs = split_mode(mode)
        torch_mode = "torch" + (GRAPHS if graphs else "")
        if base in ("adaptive", "static") and torch_mode in by_mode:
            pairs.append((mode, torch_mode))
    return pairs


def summary_rows(payload: dict) -> list[dict]:
    """gpu-check rows: tokens/s per mode and client count; each mode's ratios to torch."""
    rows, by_mode = [], {}
    for r in payload["results"]:
        if "error" in r:
            rows.append({"case": r["mode"], "value": "FAILED", "unit": "",
                         "note": r["error"][:300], "rc": 1})
            continue
        by_mode[r["mode"]] = r
        for clients, load in r["loads"].items():
            rows.append({"case": f"{r['mode']} x{clients}",
                         "value": f"{load['tokens_per_s']:.1f}", "unit": "tokens/s",
                         "note": f"{load['throughput_rps']:.2f} req/s, TTFT p50 "
                         f"{_f(load['ttft_ms'].get('p50'), '.1f')} ms, per-token p50/p99 "
                         f"{_f(load['token_ms'].get('p50'), '.2f')}/"
                         f"{_f(load['token_ms'].get('p99'), '.2f')} ms, {load['ok']}/"
                         f"{load['sent']} ok, misses {_f(load.get('misses_in_load'), 'd')}"})
    for mode, torch_mode in against_torch(by_mode):
        base = by_mode[torch_mode]
        for clients, load in by_mode[mode]["loads"].items():
            if clients in base["loads"]:
                x = ratios(load, base["loads"][clients])
                rows.append({"case": f"{mode} / {torch_mode} x{clients}",
                             "value": _f(x["tokens_per_s"], ".3f"), "unit": "x tokens/s",
                             "note": f"per-token p99 {_f(x['token_p99'], '.3f')}x (bar <= "
                             f"{TARGETS['token_p99']}), TTFT p99 {_f(x['ttft_p99'], '.3f')}x"})
    return rows


def main(out_dir: str) -> list[dict]:
    """gpu-check entry point: the full run on the GPU (about 4 minutes); summary rows."""
    from server import resolve_device
    if resolve_device("auto") != "cuda":
        return [{"case": "skipped", "value": "-", "unit": "", "note": "no CUDA device"}]
    payload = run(out_dir)
    print(table(payload), flush=True)                   # the side-by-side table last
    return summary_rows(payload)


def cli(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=os.environ.get("OUT", "."), help="folder for the JSON")
    p.add_argument("--device", default="auto", help="auto, cuda, cuda:N or host (dry run)")
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--clients", default=",".join(map(str, CONCURRENCY)),
                   help="client counts, one timed load each")
    p.add_argument("--per-client", type=int, default=8,
                   help="each load serves this many requests per client (the same in every "
                   "mode)")
    p.add_argument("--windows", type=int, default=2,
                   help="each load's requests in this many parts, each served by every mode "
                   "in turn (1: each mode's loads in one go, mode after mode)")
    p.add_argument("--duration-s", type=float, default=120.0,
                   help="each window's time limit")
    p.add_argument("--max-tokens", type=int, default=64, help="new tokens per request")
    p.add_argument("--max-batch", type=int, default=32)
    p.add_argument("--preset", default=None, help="default 1b on the GPU, tiny on the host")
    p.add_argument("--warmup-limit-s", type=float, default=90.0,
                   help="the server warm-up stops after this (checked from its second round on)")
    p.add_argument("--quick", action="store_true", help="tiny model, short run (dry run)")
    args = p.parse_args(argv)
    from server import resolve_device
    if args.device == "auto" and resolve_device("auto") != "cuda" and not args.quick:
        print("gpu_server: SKIP (no CUDA device; use --device host for a dry run)")
        return 0
    payload = run(args.out, args.device, args.modes.split(","),
                  [int(c) for c in args.clients.split(",")], args.duration_s, args.quick,
                  args.preset, args.max_tokens, warmup_limit_s=args.warmup_limit_s,
                  max_batch=args.max_batch, per_client=args.per_client,
                  windows=args.windows)
    for row in summary_rows(payload):
        print(f"{row['case']:<24} {row['value']:>9} {row['unit']:<10} {row.get('note', '')}")
    print(table(payload), flush=True)                   # the side-by-side table last
    return 0 if all("error" not in r for r in payload["results"]) else 1


if __name__ == "__main__":
    sys.exit(cli())
