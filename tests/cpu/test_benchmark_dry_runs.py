"""Every GPU benchmark that has a host dry run completes it here, so that a Python error in
a benchmark shows in CI and never costs device time. (The numbers are not checked: these
are CPU runs of GPU benchmarks.)"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest
from background import Job

ROOT = Path(__file__).resolve().parents[2]

DRY_RUNS = {   # the fewest launches that still run every code path
    # (its --quick settle and block lengths: the default 1 s of untimed launches before
    # each round's block made this dry run 17 s of the runner's 23)
    "gpu_counterlog": (["--device", "host", "--launches", "60", "--rounds", "2",
                        "--accuracy-calls", "10", "--settle-s", "0.05", "--round-s", "0"],
                       "side by side"),
    "gpu_generate": (["--device", "host", "--quick"], "adaptive/torch ratios above"),
    "gpu_decode_attention": (["--device", "host", "--quick"], "decode attention targets"),
    "gpu_pack": (["--device", "host", "--quick"], "pack size:"),
    "gpu_hostpath": (["--device", "host", "--quick"], "Lk + 1 per call"),
    "cpu_patched_linear": (["--quick"], "same greedy tokens: True"),
    # one oracle round (--quick's default: 3): each condition's tables are timed by the same
    # code, a third of the calls (alone: 13.7 s of CPU with 3 rounds, 5.4 s with one)
    "gpu_contention": (["--device", "host", "--quick", "--oracle-rounds", "1"],
                       "contention targets"),
    "gpu_prefill": (["--quick"], "prefill, adaptive / torch (median of rounds)"),
    "probe_causal_prefill": (["--dry-run"], "probe_causal_prefill.json"),
}


# One fresh process runs every dry run in turn, each as its script would run (``__main__``,
# its own argv, its folder first on sys.path), so torch and transformers are imported once
# rather than once a benchmark; its stdout and stderr go to a file each, its exit code to
# the runner's stdout.
RUNNER = r"""
import contextlib, json, os, runpy, sys, traceback
for name, script, argv, out_base in json.loads(sys.argv[1]):
    sys.argv, sys.path[0], code = [script, *argv], os.path.dirname(script), 0
    with open(out_base + ".out", "w") as out, open(out_base + ".err", "w") as err, \
            contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            runpy.run_path(script, run_name="__main__")
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else exc.code is not None
            if isinstance(exc.code, str):
                print(exc.code, file=sys.stderr)
        except BaseException:
            traceback.print_exc()
            code = 1
    print(json.dumps({"name": name, "rc": int(code)}), flush=True)
"""


def _runner_args(folder: Path, config) -> list[str]:
    jobs = [[name, str(ROOT / "benchmarks" / f"{name}.py"),
             [*DRY_RUNS[name][0], "--out", str(folder / name)], str(folder / name)]
            for name in sorted(DRY_RUNS)]
    for name in DRY_RUNS:
        (folder / name).mkdir()
    return ["-c", RUNNER, json.dumps(jobs)]


# all of them in one process in the background, from the start of the session
BACKGROUND = {"benchmark-dry-runs": Job(_runner_args, cpu_s=35.0, nice=19, cwd=ROOT,
                                        timeout_s=240 * len(DRY_RUNS))} \
    if importlib.util.find_spec("sklearn") else {}


@pytest.fixture(scope="module")
def dry_runs(background):
    """name -> (exit code or None if never finished, stdout, stderr, its --out folder)."""
    pytest.importorskip("sklearn")
    done = background("benchmark-dry-runs")
    base = done.folder
    codes = {}
    for line in done.stdout.splitlines():
        if line.startswith("{"):
            record = json.loads(line)
            codes[record["name"]] = record["rc"]

    def text(path):
        return path.read_text() if path.exists() else ""
    runs = {name: (codes.get(name), text(base / f"{name}.out"), text(base / f"{name}.err"),
                   base / name) for name in DRY_RUNS}
    return runs, done


@pytest.mark.parametrize("name", sorted(DRY_RUNS))
def test_benchmark_dry_run_completes_on_the_host(name, dry_runs):
    runs, runner = dry_runs
    rc, stdout, stderr, out = runs[name]
    _, last_words = DRY_RUNS[name]
    assert rc == 0, (f"{name}: exit code {rc} (the runner's: {runner.rc})\n"
                     + stdout[-3000:] + stderr[-3000:] + runner.stderr[-3000:])
    assert last_words in stdout, stdout[-3000:]
    assert any(out.iterdir()), "the benchmark wrote nothing under --out"


def test_gpu_generate_lockstep_is_generates_computation(dry_runs):
    """The lockstep loop (both models token by token in one thread) reproduces torch's
    generate() tokens of the same requests, and its ratios are judged beside the rounds'."""
    runs, _ = dry_runs
    rc, stdout, _, _ = runs["gpu_generate"]
    assert rc == 0, stdout[-3000:]
    line = next(x for x in stdout.splitlines() if "lockstep loop's torch tokens" in x)
    same, total = map(int, re.search(r"(\d+)/(\d+) sequences", line).groups())
    assert same == total > 0, line
    # the greedy comparison of the two models is a count too (a profile loop once reused
    # its name and printed the requests instead)
    line = next(x for x in stdout.splitlines() if "greedy tokens identical" in x)
    assert re.search(r"identical \(first \d+\) +\d+/\d+ sequences", line), line
    # each batch size's profiles side by side, without the patched calls' ranges, each
    # mode's two (ABBA) summed: the wall, the host time outside torch's ops and in them,
    # and the ops that differ most
    for batch in (1, 3):
        at = stdout.index(f"profile batch {batch} (no ranges, two requests a mode, ABBA): "
                          "wall torch ")
        head, *diffs = stdout[at:].splitlines()[:11]
        assert re.search(r"host outside torch's ops torch -?\d+\.\d, adaptive -?\d+\.\d ms",
                         head), head
        assert all(re.search(r"host +[+-]\d+\.\d\d ms \(calls \d+ -> \d+; device", d)
                   for d in diffs), diffs
        # torch's side: the same request twice makes the same calls twice (adaptive's may
        # route one call of the second through the dispatcher)
        calls = [int(re.search(r"calls (\d+) ->", d).group(1)) for d in diffs]
        assert all(n % 2 == 0 for n in calls), diffs
        assert not any(d.strip().startswith("adaptive::") for d in diffs), diffs
    for batch in (1, 3):
        for what in ("tokens/s", "per-token p99"):
            assert re.search(rf"ratio \(lockstep\) batch {batch} {re.escape(what)} "
                             r"adaptive/torch +\d+\.\d{3} x +target", stdout), stdout[-3000:]


def test_gpu_selection_dry_run_writes_its_report(tmp_path, monkeypatch, capsys,
                                                quick_selection_report):
    """In this process, on the quick host report the selection tests read too (running
    the same quick benchmark twice would double the suite's longest test)."""
    import adaptive.bench.selection
    sys.path.insert(0, str(ROOT))
    from benchmarks import gpu_selection
    asked = []

    def run_selection(backend, quick, seed, progress, learned):
        asked.append((backend, quick, seed, learned))
        return quick_selection_report
    monkeypatch.setattr(adaptive.bench.selection, "run_selection", run_selection)
    assert gpu_selection.main(["--backend", "host", "--quick", "--out", str(tmp_path)]) == 0
    assert gpu_selection.main(["--backend", "host", "--quick", "--out", str(tmp_path),
                               "--learned", "race_ratio=1.5", "--learned", "samples=2",
                               "--learned", "widen_margin=None"]) == 0
    assert asked == [("host", True, 0, {}),
                     ("host", True, 0, {"race_ratio": 1.5, "samples": 2,
                                        "widen_margin": None})]
    out = capsys.readouterr().out
    assert "selection targets" in out
    assert "learned policies with race_ratio=1.5, samples=2, widen_margin=None" in out
    assert (tmp_path / "gpu_selection.json").exists()
    with pytest.raises(SystemExit):
        gpu_selection.main(["--learned", "race_ratio"])
    assert "expected NAME=VALUE, e.g. race_ratio=1.5" in capsys.readouterr().err
    # the saved run, read back on any machine: the same report, verdicts and figure
    pytest.importorskip("matplotlib")
    figure = tmp_path / "selection.png"
    assert gpu_selection.main(["--from-json", str(tmp_path / "gpu_selection.json"),
                               "--plot", str(figure)]) == 0
    assert len(asked) == 2                                   # nothing run again
    again = capsys.readouterr().out
    assert again.splitlines()[:-1] == str(quick_selection_report).splitlines()
    assert again.splitlines()[-1] == f"wrote {figure}"
    assert figure.read_bytes()[:4] == b"\x89PNG"


def test_gpu_spmm_attention_targets_are_computed_from_a_result():
    sys.path.insert(0, str(ROOT))
    from benchmarks.gpu_spmm_attention import targets
    result = {"spmm": [{"structure": "block32", "density": 0.1, "N": 256, "times_ms": {
        "bsr32_mma": 0.02, "cublas_dense": 0.04, "cusparse_csr": 0.5}}],
        "attention": [{"Lq": 2048, "Lk": 2048, "causal": True, "times_ms": {
            "flash2_mma": 1.0, "sdpa_torch": 0.4}}, {"Lq": 1, "Lk": 8192, "causal": True,
                                                        "times_ms": {"decode_global": 0.2}}]}
    rows = {t: (m, ok) for t, m, ok in targets(result)}
    spmm = next(v for t, v in rows.items() if t.startswith("spmm N=256"))
    assert spmm[1] and "2.00x cuBLAS" in spmm[0]
    attention = next(v for t, v in rows.items() if t.startswith("attention L=2048"))
    assert not attention[1] and "2.50x SDPA" in attention[0]          # over 2x: not met
    assert not any(t.startswith("attention L=1 ") for t in rows)      # decode is not L >= 2048
    assert rows["the best variant differs across inputs"][1]


def test_gpu_counterlog_judges_cupti_against_the_process_before_it():
    """CUPTI, once enabled, costs launches after it is off: a CUPTI-phase mode's loss is
    also taken against the stream's off rate before CUPTI (the events phase), with the
    fresh-process rate kept beside it; the events phase is left as it was."""
    sys.path.insert(0, str(ROOT))
    from benchmarks.gpu_counterlog import against_before_cupti
    results = [
        {"stream": "host_bound", "phase": "events", "off_launches_per_s": 100_000.0,
         "modes": {"events": {"launches_per_s": 91_000.0, "loss": 0.09}}},
        {"stream": "host_bound", "phase": "cupti", "off_launches_per_s": 61_000.0,
         "modes": {"cupti_raw": {"launches_per_s": 60_000.0, "loss": 1 - 60 / 61}}}]
    against_before_cupti(results, {"host_bound": 98_000.0})
    raw = results[1]["modes"]["cupti_raw"]
    assert raw["loss_vs_before_cupti"] == pytest.approx(0.40)
    assert results[1]["off_before_cupti"] == 100_000.0
    assert results[1]["off_fresh_process"] == 98_000.0
    assert "loss_vs_before_cupti" not in results[0]["modes"]["events"]
    against_before_cupti(results[1:], {})          # no events phase: nothing to judge by
    assert raw["loss_vs_before_cupti"] is None and results[1]["off_fresh_process"] is None


def test_gpu_regen_logic_runs_on_the_host(tmp_path):
    pytest.importorskip("sklearn")
    sys.path.insert(0, str(ROOT))
    from benchmarks import gpu_regen
    rows = gpu_regen.main(str(tmp_path / "regen"), backend="host", dims={"R": 64, "C": 96})
    cases = [r["case"] for r in rows]
    # whether the trigger fires depends on host timings (a loaded CI machine may not):
    # this is a dry run of the code paths, the GPU run checks the outcome
    assert "trigger fired" in cases and any(c.endswith("exhaustive best") for c in cases), rows
    assert (tmp_path / "regen" / "regen.json").exists()


def test_gpu_decode_attention_targets_are_judged_per_shape():
    sys.path.insert(0, str(ROOT))
    from benchmarks.gpu_decode_attention import finish_row, targets
    base = {"B": 1, "H": 32, "Hkv": 8, "Lq": 1, "Lk": 4096, "D": 128, "bytes": 4_200_000,
            "splitkv_ms": 0.002, "measure_each_ms": 0.002, "kind": "decode"}
    slow_sdpa = finish_row({**base, "name": "a", "times_ms": {"sdpa": 0.004},
                            "adaptive_ms": 0.00125}, 4.2e12)     # SDPA 25%, ours 80% of copy
    assert abs(slow_sdpa["sdpa_pct_copy"] - 25) < 1e-9
    assert abs(slow_sdpa["adaptive_x_sdpa"] - 3.2) < 1e-9
    fast_sdpa = finish_row({**base, "name": "b", "kind": "near_ceiling",
                            "times_ms": {"sdpa": 0.0011}, "adaptive_ms": 0.00113}, 4.2e12)
    rows = {t.split(":")[0] + t.split(":")[1][:8]: ok for t, _, ok in targets([slow_sdpa,
                                                                              fast_sdpa])}
    assert rows == {"a >= 1.30": True, "a >= 80% ": True, "b >= 0.98": False}, rows


def test_gpu_contention_dry_run_reports_each_condition_from_its_printed_numbers(dry_runs):
    """The contention report: every condition (idle, each load, idle again) with a row per
    input, the load's throughput and the device state the policy saw; each printed
    steady/oracle is the quotient of the two printed times, each condition's geomean is
    that of its rows, and the targets say met or NOT met on those geomeans."""
    import math
    runs, _ = dry_runs
    rc, stdout, stderr, out = runs["gpu_contention"]
    assert rc == 0, stdout[-3000:] + stderr[-3000:]
    report = json.loads((out / "contention.json").read_text())
    names = [c["condition"] for c in report["conditions"]]
    assert names == ["idle", "stream load", "idle after stream", "process load",
                     "idle after process"]
    assert len(report["inputs"]) == 5 and report["sample_every"] == 4
    lines = stdout.splitlines()
    for c in report["conditions"]:
        assert [r["input"] for r in c["rows"]] == report["inputs"]
        assert set(c["device_state_policy"]) >= {"dev.known", "dev.sm_clock_ratio",
                                                 "dev.other_processes"}
        if c["load"]:
            load = c["load_result"]
            assert load["launches"] > 0 and load["launches_per_s"] > 0, load
            assert 0 < load["vs_alone"], load
        ratios = []
        for r in c["rows"]:
            assert r["choice"] in r["times_ms"] and r["oracle_choice"] in r["times_ms"]
            assert r["calls"] == report["rounds"] or c["condition"] == "idle"
            steady, oracle = f"{r['steady_ms']:.5g}", f"{r['oracle_ms']:.5g}"
            row = [ln.split() for ln in lines if ln.split()[:1] == [r["input"]]
                   and ln.split()[1] == r["choice"] and ln.split()[2:4] == [steady, oracle]]
            assert row, f"{c['condition']} {r['input']}: no printed row with {steady} {oracle}"
            printed = float(row[0][4])
            assert printed == round(float(steady) / float(oracle), 3)
            assert printed >= 1.0                   # the oracle is the fastest of the table
            ratios.append(r["ratio"])
        geomean = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
        assert c["geomean_ratio"] == pytest.approx(geomean, rel=1e-12)
        assert f"geomean steady/oracle {geomean:.3f}" in stdout
        # the caller-time table: the same inputs, each choice's and the fastest candidate's
        # wall per call, their quotient printed, and its geomean (information, not a target)
        callers = [r["caller"] for r in c["rows"]]
        for k in callers:
            assert k["ratio"] == k["steady_ms"] / k["oracle_ms"] >= 1.0
            assert f"({k['oracle_choice']}): {k['ratio']:.3f}" in stdout
        caller_geomean = math.exp(sum(math.log(k["ratio"]) for k in callers) / len(callers))
        assert c["caller_geomean_ratio"] == pytest.approx(caller_geomean, rel=1e-12)
        assert f"{c['condition']} {caller_geomean:.3f}" in stdout.split(
            "caller time, steady/oracle by condition")[1]
    targets = {t: (m, ok) for t, m, ok in report["targets"]}
    assert len(targets) == len(names) + 1
    assert targets["measured with and without a co-running load"] == (
        "stream load, process load", True)
    for c in report["conditions"]:
        (measured, ok), = [v for t, v in targets.items() if t.startswith(c["condition"] + ":")]
        assert measured.startswith(f"{c['geomean_ratio']:.3f}")
        assert ok == (round(c["geomean_ratio"], 3) <= 1.10)
    assert len(report["under_load"]) == 2 * len(report["inputs"])
    assert stdout.rstrip().endswith(("| met |", "| NOT met |"))


def test_the_headline_compares_adaptive_with_the_better_plain_pytorch_way():
    """Per client count the baseline is the plain-PyTorch mode with more tokens/s (dense
    matmuls or torch's 2:4 path on a pruned model), and each of issue 13's bars is judged
    on adaptive's ratio to it: p99 lower is better, the others higher."""
    sys.path.insert(0, str(ROOT))
    from benchmarks.gpu_headline import compare

    def load(tps, p99, sm):
        return {"tokens_per_s": tps, "throughput_rps": tps / 100, "ttft_ms": {"p99": 50.0},
                "token_ms": {"p50": 10.0, "p99": p99}, "device": {"sm_active_ratio": sm}}
    payload = {"concurrency": [8, 32], "results": [
        {"mode": "torch", "loads": {"8": load(100.0, 40.0, 0.5), "32": load(300.0, 90.0, 0.5)}},
        {"mode": "torch24", "loads": {"8": load(90.0, 30.0, 0.4), "32": load(400.0, 80.0, 0.6)}},
        {"mode": "adaptive", "loads": {"8": load(130.0, 30.0, 0.7), "32": load(480.0, 70.0,
                                                                               0.6)}}]}
    rows = {r["clients"]: r for r in compare(payload, "2:4")}
    assert rows[8]["baseline"] == "torch" and rows[32]["baseline"] == "torch24"
    c8 = rows[8]["checks"]
    assert c8["tokens_per_s"] == (1.3, 1.23, True)
    assert c8["token_p99"] == (0.75, 0.82, True)
    assert c8["sm_active"][0] == pytest.approx(1.4) and c8["sm_active"][2]
    c32 = rows[32]["checks"]
    assert c32["tokens_per_s"] == (1.2, 1.23, False)        # 480 / 400: under the bar
    assert c32["token_p99"] == (0.875, 0.82, False)
    assert c32["sm_active"][0] == pytest.approx(1.0) and not c32["sm_active"][2]
    dense = {r["clients"]: r for r in compare({**payload, "results": [
        payload["results"][0], payload["results"][2]]}, "dense")}
    assert set(dense[8]["checks"]) == {"tokens_per_s", "token_p99"}   # dense: two bars
    assert dense[32]["checks"]["tokens_per_s"] == (1.6, 1.05, True)
    nocudnn = {"mode": "torch-nocudnn", "loads": {"8": load(120.0, 35.0, 0.5),
                                                  "32": load(250.0, 95.0, 0.5)}}
    both = {r["clients"]: r for r in compare({**payload, "results": [
        payload["results"][0], nocudnn, payload["results"][2]]}, "dense")}
    assert both[8]["baseline"] == "torch-nocudnn" and both[32]["baseline"] == "torch"
    assert both[8]["checks"]["tokens_per_s"] == (130.0 / 120.0, 1.05, True)
    assert both[8]["checks"]["token_p99"] == (30.0 / 35.0, 0.95, True)
    failed = compare({**payload, "results": payload["results"][:2]}, "2:4")
    assert all("error" in r for r in failed)                 # no adaptive: no comparison
    # decode steps in CUDA graphs: adaptive+graphs against the better plain way, graphs
    # or not (a plain-PyTorch user can capture decode steps too)
    graphed = {"mode": "torch-nocudnn+graphs", "loads": {"8": load(125.0, 20.0, 0.9),
                                                         "32": load(200.0, 60.0, 0.9)}}
    ours = {**payload["results"][2], "mode": "adaptive+graphs"}
    g = {r["clients"]: r for r in compare({**payload, "results": [
        payload["results"][0], graphed, ours]}, "dense")}
    assert (g[8]["baseline"], g[8]["adaptive"]) == ("torch-nocudnn+graphs", "adaptive+graphs")
    assert g[8]["checks"]["token_p99"] == (1.5, 0.95, False)
    assert g[32]["baseline"] == "torch"                      # 300 tokens/s against 200
    from benchmarks.gpu_server import against_torch, split_mode
    assert split_mode("adaptive+graphs") == ("adaptive", True)
    assert split_mode("torch-nocudnn") == ("torch-nocudnn", False)
    for bad in ("+graphs", "adaptive+graphs+graphs", "adaptive+eager"):
        with pytest.raises(ValueError, match="optionally with '\\+graphs'"):
            split_mode(bad)
    assert against_torch(dict.fromkeys(["torch", "torch+graphs", "adaptive",
                                        "static+graphs", "adaptive+graphs"])) == [
        ("adaptive", "torch"), ("static+graphs", "torch+graphs"),
        ("adaptive+graphs", "torch+graphs")]


def test_the_knobs_replay_sums_each_setting_over_the_dealings_it_is_given(monkeypatch, capsys):
    """cpu_replay_knobs --fold-seeds: one replay per seed and setting, each row the mean
    over the dealings with the least within 5% beside it and the largest worst."""
    sys.path.insert(0, str(ROOT))
    import adaptive.bench.replay as replay
    from adaptive.bench.replay import Case, ReplayReport
    from benchmarks import cpu_replay_knobs
    asked = []

    def fake(pack, ops=None, folds=10, noise=None, fold_seed=0, **knobs):
        asked.append((ops, folds, noise, fold_seed, knobs))
        ratios = {0: (1.0, 1.0, 1.2, 1.0), 1: (1.0, 1.1, 1.06, 1.0)}[fold_seed]
        return ReplayReport(pack, "learned", tuple(
            Case("spmm", "float16", {"N": i}, 10, 3, "a", "b", r, samples=4)
            for i, r in enumerate(ratios)), folds, fold_seed)
    monkeypatch.setattr(replay, "replay", fake)
    assert cpu_replay_knobs.main(["--pack", "p", "--ops", "spmm", "--noise", "none",
                                  "--fold-seeds", "0,1", "--set", "w:samples=2"]) == 0
    assert asked == [(["spmm"], 10, None, 0, {}), (["spmm"], 10, None, 1, {}),
                     (["spmm"], 10, None, 0, {"samples": 2}),
                     (["spmm"], 10, None, 1, {"samples": 2})]
    rows = [line.split() for line in capsys.readouterr().out.splitlines()
            if line.split()[:2] in (["default", "spmm"], ["w", "spmm"])]
    geo = (1.2 ** 0.25 + (1.1 * 1.06) ** 0.25) / 2
    for row in rows:        # within 5%: 75% and 50%; worst 1.20x; tuning 4 x 4 / (4 x 40)
        assert row[2:] == ["4", f"{geo:.3f}", "62.5%", "(50%)", "1.20x", "10.0%"], row
    assert len(rows) == 2
    with pytest.raises(SystemExit):
        cpu_replay_knobs.main(["--fold-seeds", "0,x"])
    assert "expected whole numbers" in capsys.readouterr().err
