"""The planted CUDA softmax kernels of tests/gpu/planted/, run on the CPU through the thin
CUDA emulation (tests/cpu/cuda_emu.py, g++) in every value regime, judged by the
verifier's own comparison and guard regions: each defect shows in its regime and not in
the normal one; the correct controls pass everywhere. The H200 run of the same kernels
through the isolated verifier is tests/gpu/test_verifier_planted.py."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import pytest

from adaptive.ops import get_op
from adaptive.regen import worker
from adaptive.regen.shapes import make_inputs

sys.path.insert(0, str(Path(__file__).parent))
import cuda_emu  # noqa: E402

PLANTED = Path(__file__).parents[1] / "gpu" / "planted"
DIMS = {"R": 12, "C": 70}
ROWS = 4
GUARD = 64                      # float32 elements of guard before and after the output

# kernel -> the regimes that must expose it (the normal regime must not)
BAD = {
    "no_max_subtraction": {"large"},
    "logsumexp_precision": {"large"},
    "online_masked_nan": {"masked"},
    "clamps_logits": {"mixed", "large"},
    "zero_row_is_padding": {"tiny"},
    "uniform_row_shortcut": {"constant"},
    "one_past_the_end": {"normal"},
    "one_before_the_start": {"normal"},
}
GOOD = ("good", "good_online", "good_serial")
PRELUDE = (f"#define ROWS {ROWS}\n"
           "inline float __expf(float v) { return std::exp(v); }\n")


SIGNATURE = [("ptr", "const T*"), "ptr", "i32", "i32"]


def _entries() -> dict:
    return {f"planted_{n}": SIGNATURE for n in [*BAD, *GOOD]}


def emu_jobs(folder: Path) -> dict:
    """Every planted kernel in one library (each entry renamed after its file):
    library -> (source, g++ flags)."""
    source = PRELUDE
    for n in [*BAD, *GOOD]:
        text = (PLANTED / f"{n}.cu").read_text()
        text = re.sub(r"\bplanted\s*\(", f"planted_{n}(", text)
        text = text.replace("rescale(", f"rescale_{n}(")
        source += f"\n// ---- {n}\n{text}"
    return {folder / "emu.so": (cuda_emu.build_source(source, _entries()), [])}


# g++ builds it in the background from the start of the session (tests/background.py)
BACKGROUND = cuda_emu.background_build(__file__, cpu_s=1.0)


@pytest.fixture(scope="module")
def kernels(background):
    (lib,) = cuda_emu.built(background, __file__, emu_jobs)
    return cuda_emu.load(lib, _entries())


def judge(kernels, name: str, regime: str, seed: int = 11) -> str:
    """'' when the verifier's checks pass, else the rejection text."""
    op = get_op("softmax")
    (x,) = make_inputs(op, DIMS, "float32", seed, regime)
    saved = x.copy()
    n = x.size
    big = np.full(n + 2 * GUARD, worker.CANARY, np.float32)
    out = big[GUARD:GUARD + n].reshape(x.shape)
    fn = kernels[f"planted_{name}"]
    grid, block = (-(-DIMS["R"] // ROWS),), (32, ROWS)
    runs = []
    for poison in (worker.SENTINEL, np.nan):
        out.fill(poison)
        fn(grid, block, (x, out, np.int32(DIMS["R"]), np.int32(DIMS["C"])))
        if not (np.all(big[:GUARD] == worker.CANARY) and np.all(big[GUARD + n:] ==
                                                                 worker.CANARY)):
            return "wrote into the guard region"
        runs.append(np.array(out, np.float64))
    assert np.array_equal(x, saved, equal_nan=True)
    with np.errstate(invalid="ignore", over="ignore"):
        ref = op.reference(x)
    try:
        worker._compare(op, DIMS, seed, regime, runs[0], runs[1], ref,
                        op.tolerance_for("float32", DIMS))
    except worker.Reject as exc:
        return f"{exc.stage.value}: {exc.detail}"
    return ""


@pytest.mark.parametrize("name", list(BAD))
def test_planted_defect_shows_in_its_regime_only(kernels, name):
    for regime in BAD[name]:          # a precision loss may hide at one seed, as in the verifier
        assert any(judge(kernels, name, regime, seed) for seed in (11, 12, 13)), \
            f"{name} passed in the {regime} regime"
    if "normal" not in BAD[name]:
        assert judge(kernels, name, "normal") == ""


@pytest.mark.parametrize("name", GOOD)
def test_correct_controls_pass_every_regime(kernels, name):
    for regime in get_op("softmax").regimes:
        assert judge(kernels, name, regime) == "", (name, regime)


def test_planted_kernels_compile_with_nvrtc(tmp_path):
    """The same sources through NVRTC (as the H200 run compiles them), so a compile error
    never costs GPU time."""
    from adaptive import nvrtc
    from adaptive.kcache import KernelCache
    if not nvrtc.available():
        pytest.skip("NVRTC is not installed")
    sys.path.insert(0, str(PLANTED.parent))
    from test_verifier_planted import planted
    for name in (*BAD, *GOOD):
        kernel = nvrtc.compile_candidate(planted(name), {"ROWS": ROWS}, "float16",
                                         cache=KernelCache(str(tmp_path)))
        assert kernel.resources.get("registers", 0) > 0, name
