"""On the H200, the shipped pack's cubins are recomputed from the registered variants and
installed into the kernel cache (on a machine without the GPU none is written: see
tests/cpu/test_pack_hardening.py); a launch then finds them without compiling."""

from __future__ import annotations

import pytest

from adaptive import config
from adaptive.packs import format as packs
from adaptive.packs import install
from adaptive.kcache import KernelCache

pytestmark = pytest.mark.gpu


def test_shipped_pack_cubins_recompute_and_install(tmp_path):
    from adaptive import nvrtc
    from adaptive.packs import shipped_packs
    if not nvrtc.available():
        pytest.skip("NVRTC (cuda.bindings) is not installed: the backend compiles with CuPy")
    install.runnable_archs.cache_clear()
    assert "sm_90" in install.runnable_archs(), install.runnable_archs()
    [h200] = [p for p in shipped_packs() if p.name == "h200.msgpack"]
    pack = packs.read_pack(h200)
    if pack.fingerprint.get("nvrtc") != nvrtc.compiler_version():
        pytest.skip(f"the pack was built with {pack.fingerprint.get('nvrtc')}, this process "
                    f"has {nvrtc.compiler_version()}: its keys cannot match")
    with config.override(cache_dir=str(tmp_path)):
        written = install.install_cubins(pack)
    assert written == len(pack.cubins) > 100
    cache = KernelCache(tmp_path)
    assert all(cache.get(c.key) is not None for c in pack.cubins)
