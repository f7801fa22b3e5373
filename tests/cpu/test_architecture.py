"""The package's shape, checked on its source: no import cycle (function-level imports
counted), no module reaching into another's underscore names, no probing of backends or
policies for capabilities their protocols do not list, `import adaptive` light, and a
Dispatcher that touches no file and starts no thread when made."""

from __future__ import annotations

import ast
import functools
import subprocess
import sys
from pathlib import Path

import pytest
from background import Job

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("adaptive", "profilers")


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


@functools.cache   # one parse per file for the whole module's tests
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text())


def _type_checking_lines(tree: ast.AST) -> set[int]:
    """Lines of imports under ``if TYPE_CHECKING:`` (for annotations only, never run)."""
    lines = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for inner in node.body:
                for n in ast.walk(inner):
                    lines.add(getattr(n, "lineno", -1))
    return lines


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """Every module of ours that ``name`` imports, at module level or in a function."""
    tree = _tree(path)
    skip = _type_checking_lines(tree)
    is_pkg = path.name == "__init__.py"
    out = set()
    for node in ast.walk(tree):
        if getattr(node, "lineno", -1) in skip:
            continue
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = name.split(".")[: len(name.split(".")) - node.level + (1 if is_pkg else 0)]
                base = ".".join(parts + ([base] if base else []))
            # `from pkg import sub` imports the submodule; `from pkg import name`, the
            # package (its ancestors load first in any case, as for every module)
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                       for a in node.names]
        else:
            continue
        for t in targets:
            if t in modules and t != name:
                out.add(t)
    return out


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))
    sys.setrecursionlimit(10000)
    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle_counting_function_level_imports():
    modules = _modules()
    graph = {m: _imports(m, p, modules) for m, p in modules.items()}
    # the top-level package re-exports the public API: every module importing a sibling
    # loads it first, as Python does for any package; its own imports must not cycle
    cycles = _cycles(graph)
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


# names of other libraries' internals we use on purpose (where they have no public form)
FOREIGN_PRIVATE = {
    "_C": "torch._C._cuda_getCurrentRawStream: torch's raw current-stream accessor",
    "_attn_implementation": "transformers' config field naming the attention function",
    "_global_mapping": "transformers' AttentionMaskInterface registry",
    "_cslt_sparse_mm": "torch's cuSPARSELt 2:4 matmul, what to_sparse_semi_structured runs "
                       "(its fused output transpose has no public form)",
}


def _private_reaches(path: Path) -> list[str]:
    tree = _tree(path)
    own = set()       # underscore names this module defines (its own objects' internals)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and \
                isinstance(node.ctx, ast.Store):
            own.add(node.attr)
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)):
            own.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            own.add(node.id)
    bad = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(PACKAGES):
            bad += [f"{path.name}:{node.lineno}: from {node.module} import {a.name}"
                    for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and \
                not node.attr.startswith("__"):
            v = node.value
            if isinstance(v, ast.Name) and v.id in ("self", "cls"):
                continue
            if isinstance(v, ast.Call) and ast.unparse(v.func) == "super":
                continue
            if node.attr in own or node.attr in FOREIGN_PRIVATE:
                continue
            bad.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
    return bad


def test_no_module_reaches_into_another_modules_underscore_names():
    bad = [b for p in _modules().values() for b in _private_reaches(p)]
    assert not bad, "\n".join(bad)


def test_the_private_reach_check_sees_one(tmp_path, monkeypatch):
    mod = tmp_path / "m.py"
    mod.write_text("from adaptive.dispatch import _first_of\n"
                   "def f(d):\n    return d._plans\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert len(_private_reaches(mod)) == 2


# capability probing of backends and policies (what their protocols must list instead)
PROBE_OWNERS = ("backend", "policy")
CAPABILITIES = {"synchronize", "event_timer", "stream_ptr", "device_state", "arch", "hold",
                "forget_key", "add_observations", "state", "rank", "cost_model", "keys",
                "model", "peaks", "limits", "fingerprint"}


def _probes(path: Path) -> list[str]:
    tree = _tree(path)
    bad = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                node.func.id in ("getattr", "hasattr") and node.args:
            target = ast.unparse(node.args[0])
            attr = node.args[1].value if len(node.args) > 1 and \
                isinstance(node.args[1], ast.Constant) else None
            if any(target.endswith(o) or f"{o}." in target or target == o
                   for o in PROBE_OWNERS) or attr in CAPABILITIES:
                bad.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
        if isinstance(node, ast.Call) and ast.unparse(node.func) == "inspect.signature":
            bad.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
    return bad


def test_backends_and_policies_are_not_probed_for_capabilities():
    bad = [b for p in _modules().values() for b in _probes(p)]
    assert not bad, ("list the capability in the Backend/Policy protocol (with a host or "
                     "BasePolicy default) instead:\n" + "\n".join(bad))


def test_protocols_list_what_the_dispatcher_uses():
    from adaptive.backends import Backend
    from adaptive.backends.host import HostBackend
    from adaptive.policy import BasePolicy, First, MeasureEach, Policy
    host = HostBackend()
    assert isinstance(host, Backend)
    for name in ("synchronize", "event_timer", "device_state", "stream_ptr", "hold", "arch"):
        assert hasattr(Backend, name) or name in Backend.__annotations__, name
    assert host.event_timer() is None and host.device_state() == {} and host.arch == "host"
    for policy in (First(), MeasureEach()):
        assert isinstance(policy, Policy) and isinstance(policy, BasePolicy)
        assert policy.state(("k",)) is None and policy.cost_model is None

    class Bare:                 # a policy that does not list what the dispatcher calls
        name = "bare"

        def decide(self, ctx, candidates):
            return None

        def observe(self, key, candidate, time_ms):
            return None
    import adaptive
    with pytest.raises(adaptive.InputTypeError, match="BasePolicy"):
        adaptive.Dispatcher("host", policy=Bare())


_NO_FILE_NO_THREAD = f"""
import builtins, io, os, threading, sys
sys.path.insert(0, {str(ROOT)!r})
import adaptive
from adaptive.runtime import start
registry, policy = adaptive.shared_registry(), adaptive.Learned()
opened = []
real_open, real_io_open = builtins.open, io.open
def spy(f, *a, **k):
    opened.append(str(f)); return real_open(f, *a, **k)
builtins.open = io.open = spy
threads = threading.active_count()
d = adaptive.Dispatcher("host", policy=policy)
builtins.open, io.open = real_open, real_io_open
assert not opened, opened
assert threading.active_count() == threads, threading.enumerate()
try:
    start(d)
except adaptive.PackError as exc:
    print("start read the pack:", str(exc)[:60])
"""


def _configured_env(folder: Path) -> dict:
    """A start-up pack (missing), a counter log and regeneration configured under folder."""
    return {"PATH": "/usr/bin:/bin", "ADAPTIVE_PACKS": str(folder / "missing.msgpack"),
            "ADAPTIVE_CACHE_DIR": str(folder / "cache"), "HOME": str(folder),
            "ADAPTIVE_COUNTER_LOG": str(folder / "run.alog"), "ADAPTIVE_REGEN": "parametric"}


# a fresh process, started with the session (it imports scikit-learn: seconds of CPU)
BACKGROUND = {"dispatcher-no-file-no-thread": Job(lambda folder, config: [
    "-c", _NO_FILE_NO_THREAD], cpu_s=4.0, nice=19, timeout_s=300, env=_configured_env)}


def test_making_a_dispatcher_touches_no_file_and_starts_no_thread(background):
    """In a fresh process with a start-up pack, a counter log and regeneration configured:
    Dispatcher() opens no file and starts no thread (the variants it chooses among and its
    policy exist before it); runtime.start() then reads the pack."""
    done = background("dispatcher-no-file-no-thread")
    assert done.rc == 0, done.report(2000)
    assert "start read the pack" in done.stdout, done.stdout
    assert not (done.folder / "run.alog").exists()   # start() stopped at the refused pack


def test_import_adaptive_loads_only_the_warm_path():
    """No SciPy, scikit-learn, regeneration, packs or counter log at `import adaptive`;
    they load on first use (the time itself is printed by `adaptive bench overhead`)."""
    code = (f"import sys; sys.path.insert(0, {str(ROOT)!r}); import adaptive; "
            "print(' '.join(sorted(sys.modules)))")
    loaded = set(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                check=True, timeout=120).stdout.split())
    for heavy in ("scipy", "sklearn", "adaptive.regen", "adaptive.packs.format",
                  "adaptive.counterlog", "adaptive.policy.learned", "msgpack", "torch"):
        assert heavy not in loaded, f"{heavy} is imported by `import adaptive`"
    import adaptive
    for name in ("counter_log", "serve_metrics", "load_pack", "explain", "Learned", "verify"):
        assert callable(getattr(adaptive, name)), name
