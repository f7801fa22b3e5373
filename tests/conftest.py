"""Test layout by hardware: ``tests/cpu`` runs anywhere; ``tests/gpu`` needs a CUDA device.

The device probe and the skipping of ``gpu``-marked tests are in ``tests/gpu/conftest.py``.
Long subprocess work (NVRTC compiles, benchmark dry runs, examples) starts once the tests
are collected and runs beside the rest (``tests/background.py``); the tests reading it run
last, or at the end of the first module that ends after all their module's jobs did. A
module's jobs start as its first reader is collected. ``--nvrtc-all`` makes the NVRTC tests
compile every config, not a covering set.
"""

from __future__ import annotations

import gc
import os
import zlib

# OpenBLAS's idle threads spin about 0.1 s after every BLAS call before they sleep (2^28
# cycles): CPU the suite's background jobs and other processes could use, on a machine
# whose every core is busy for the whole run. Set before NumPy is first imported (here, and
# inherited by every subprocess: verifier workers, background jobs), it makes them sleep
# at once; thread counts and results are unchanged (a verifier worker: 0.8 -> 0.5 s of CPU).
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")

import numpy as np
import pytest
from background import Running

_RUNNING = pytest.StashKey[dict]()
_WAITING = pytest.StashKey[list]()   # [(job names, that module's reader items)] not yet run


@pytest.fixture(autouse=True)
def _no_emulated_faults():
    """A test whose emulated kernels made an access the GPU faults on (tests/cpu/cuda_emu:
    a misaligned vector load or store) fails with the emulator's report."""
    yield
    import sys
    emu = sys.modules.get("cuda_emu")
    if emu is not None:
        reports = emu.fault_reports()
        assert not reports, (f"an emulated kernel made {len(reports)} access(es) the GPU "
                             "faults on:\n" + "\n".join(reports[:20]))


def pytest_addoption(parser):
    parser.addoption("--nvrtc-all", action="store_true", default=False,
                     help="compile every CUDA variant x config x dtype with NVRTC (default: "
                          "a covering set: every variant, dtype and parameter value)")


# fixtures whose live timings (a policy's choices) would be disturbed by background work:
# their tests run after the readers of every background job. ``no_collections``: the
# policy tests that time real sleeps (test_measured_charges_the_latency_to_the_launch_not_
# the_work_after_it failed in 2 of 2 suites beside the replays' background job)
QUIET = ("quick_selection_report", "no_collections")


def pytest_itemcollected(item):
    """A module's background jobs start as its first reader is collected, so they run beside
    the rest of the collection (imports on one core: 7 s); a job whose readers all end up
    deselected is stopped once the selection is known."""
    config = item.config
    if config.option.collectonly or "background" not in getattr(item, "fixturenames", ()):
        return
    running = config.stash.setdefault(_RUNNING, {})
    for name, job in getattr(item.module, "BACKGROUND", {}).items():
        if name not in running:
            running[name] = Running(name, job, config)


@pytest.hookimpl(trylast=True)   # after -k / -m deselection: no job for a deselected test
def pytest_collection_modifyitems(session, config, items):
    """Start the background jobs of the modules with tests reading one (those collection has
    not started) and stop the others; the readers go last, then the tests that time live
    choices (``QUIET``)."""
    def uses(item, names):
        return any(n in getattr(item, "fixturenames", ()) for n in names)
    readers = [item for item in items if uses(item, ("background",))]
    jobs = {}
    for item in readers:
        jobs.update(getattr(item.module, "BACKGROUND", {}))
    reading = set(map(id, readers))

    def place(item):
        if uses(item, QUIET):
            return (2, 0.0)
        if id(item) in reading:
            return (1, max((j.cpu_s for j in getattr(item.module, "BACKGROUND", {}).values()),
                           default=0.0))
        return (0, 0.0)
    items.sort(key=place)   # stable: the order within each group is kept
    running = config.stash.get(_RUNNING, {})
    for name in [n for n in running if n not in jobs]:    # its readers were deselected
        running.pop(name).stop()
    if jobs and not config.option.collectonly:
        for name, job in sorted(jobs.items(), key=lambda kv: -kv[1].cpu_s):
            if name not in running:
                running[name] = Running(name, job, config)
        config.stash[_RUNNING] = running
        groups: dict = {}
        for item in items:
            if id(item) in reading and not uses(item, QUIET):
                groups.setdefault(item.module, []).append(item)
        config.stash[_WAITING] = [(set(getattr(m, "BACKGROUND", {})), group)
                                  for m, group in groups.items()]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """At the end of a module, the readers of a module whose background jobs have all ended
    run next (not at the end of the session: there they ran on one core, the jobs long
    done, 16 s of a 90 s run). Only between modules: ``item``'s teardown was for
    ``nextitem``, a test of another module, so nothing of ``item``'s module is left set up
    for a moved reader to find."""
    result = yield
    waiting = item.config.stash.get(_WAITING, [])
    if waiting and nextitem is not None and nextitem.module is not item.module:
        running = item.config.stash[_RUNNING]
        ready = [entry for entry in waiting if all(running[n].done() for n in entry[0])]
        if ready:
            items = item.session.items
            at = {id(i): k for k, i in enumerate(items)}
            # only readers still to run move (one that ran already, or ``item`` itself,
            # stays: moving it left ``item`` out of the list, a StopIteration below)
            moved = [reader for _, group in ready for reader in group
                     if at.get(id(reader), -1) > at[id(item)]]
            gone = set(map(id, moved))
            rest = [i for i in items if id(i) not in gone]
            here = next(k for k, i in enumerate(rest) if i is item) + 1
            items[:] = rest[:here] + moved + rest[here:]   # in place: the run loop's list
            waiting[:] = [entry for entry in waiting if not any(entry is r for r in ready)]
    return result


def pytest_collection_finish(session):
    """What collection imported (torch, transformers, scikit-learn: ~500k objects) lives to
    the end: out of the cyclic collector's reach, so the tests' full collections (gc.collect
    in the soak and memory tests, the automatic ones) do not walk it each time. The same
    for what each module's tests leave alive (see ``pytest_runtest_setup``)."""
    gc.collect()
    gc.freeze()


_last_module = [None]


def pytest_runtest_setup(item):
    module = getattr(item, "module", None)
    if module is not _last_module[0]:
        _last_module[0] = module
        gc.collect()      # cheap: the objects of earlier modules are frozen already
        gc.freeze()


def pytest_unconfigure(config):
    for running in config.stash.get(_RUNNING, {}).values():
        running.stop()


@pytest.fixture(scope="session")
def background(request):
    """``background(name)``: wait for that background job and return its ``Finished``."""
    running = request.config.stash.get(_RUNNING, {})

    def result(name: str):
        if name not in running:
            pytest.fail(f"background job {name!r} was not started (declared in the module's "
                        "BACKGROUND?)")
        return running[name].result()
    return result


@pytest.fixture
def decided_on_the_miss():
    """Misses decide on the calling thread (``ADAPTIVE_DECIDE_OFF_THREAD=0``): for tests that
    script a key's calls one by one (which call explores what, which reach the
    dispatcher). The default, a worker deciding while the library's candidate serves, has
    its own tests (``tests/cpu/test_dispatch.py``)."""
    from adaptive import config
    with config.override(decide_off_thread=False):
        yield


@pytest.fixture
def rng(request):
    """A fresh generator per test, seeded from the test's id so failures reproduce."""
    seed = zlib.crc32(request.node.nodeid.encode())
    return np.random.default_rng(seed)


@pytest.fixture(scope="session")
def shipped_pack_contents():
    """``read_pack`` of each shipped pack, read once for the tests that only read one (0.65
    s of CPU a read of the H200 pack; a Pack is frozen, its variants and rows tuples of
    frozen dataclasses): file name -> Pack. Tests of loading a pack read it themselves."""
    from adaptive.packs import shipped_packs
    from adaptive.packs.format import read_pack
    return {path.name: read_pack(path) for path in shipped_packs()}


@pytest.fixture(scope="session")
def quick_selection_report():
    """``run_selection("host", quick=True, seed=0)``, run once for every test that reads it
    (the selection tests and the selection benchmark's dry run)."""
    pytest.importorskip("sklearn")
    from adaptive.bench.selection import run_selection
    return run_selection("host", quick=True, seed=0)
