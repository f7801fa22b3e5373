"""CUPTI activity buffers taken straight from libcupti through ``ctypes``.

cupti-python's ``activity_register_callbacks`` builds a Python object for every record
of a completed buffer before our callback runs. Measured on the H200 (run S5,
``benchmarks/probe_cupti_variants.py``), that alone cost a launch stream 54–60% of its
launches (GPU-bound) and 72–86% (host-bound), with a callback that only counted; the same
activity kinds with the buffer callbacks registered here cost 2.0%. So:

* the buffer callbacks are registered with ``ctypes`` on the libcupti the binding loaded
  (everything else, enabling kinds and pushing ids, still goes through the binding: those
  are single C calls);
* a completed buffer is copied out whole on CUPTI's thread (one ``memcpy`` under the GIL)
  and handed back to CUPTI at once;
* the reader parses the copies: records are walked by kind with each kind's record size,
  and the fields are gathered with NumPy at their offsets. Sizes and offsets come from
  the binding's record dtypes and are checked once against CUPTI's own
  ``cuptiActivityGetNextRecord`` walk of the first buffers; a buffer the fast walk cannot
  account for exactly (an unknown kind, a record past the end) is walked by CUPTI.
"""

from __future__ import annotations

import collections
import ctypes
import threading
from time import thread_time

import numpy as np

# the record dtypes of the binding (cupti-python 13) for the kinds the activity enables
_DTYPES = {"CONCURRENT_KERNEL": "activity_kernel10_dtype",
           "EXTERNAL_CORRELATION": "activity_external_correlation_dtype",
           "DRIVER": "activity_api_dtype", "RUNTIME": "activity_api_dtype"}
_CHECKED_BUFFERS = 2       # buffers walked by CUPTI as well, to check the fast walk
# every registration's callbacks and buffers, never freed: CUPTI keeps the function
# pointers (and may hold buffers) after a later registration replaces them
_ALIVE: list = []


def loaded_cupti_path() -> str | None:
    """The libcupti this process has mapped (the binding's copy), or None."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                if "libcupti" in line:
                    return line.split()[-1]
    except OSError:
        return None
    return None


class Layout:
    """Where the fields the reader needs sit in each enabled kind's record.

    Args:
        kinds: the ``ActivityKind`` enum.
        dtypes: kind name -> NumPy structured dtype of its record (the binding's).
    """

    def __init__(self, kinds, dtypes: dict):
        self.kernel = int(kinds.CONCURRENT_KERNEL)
        self.external = int(kinds.EXTERNAL_CORRELATION)
        self.sizes: dict[int, int] = {}           # kind -> record bytes (8-byte aligned)
        for name, dtype in dtypes.items():
            self.sizes[int(getattr(kinds, name))] = (dtype.itemsize + 7) & ~7
        k, e = dtypes["CONCURRENT_KERNEL"].fields, dtypes["EXTERNAL_CORRELATION"].fields
        self.k_start, self.k_end = k["start"][1], k["end"][1]
        self.k_corr, self.k_name = k["correlation_id"][1], k["name"][1]
        self.e_ext, self.e_corr = e["external_id"][1], e["correlation_id"][1]
        for off, width in ((self.k_start, 8), (self.k_end, 8), (self.k_name, 8),
                           (self.e_ext, 8), (self.k_corr, 4), (self.e_corr, 4)):
            if off % width:
                raise ValueError(f"CUPTI record field at offset {off} is not {width}-byte "
                                 "aligned; the fast walk reads aligned words")

    @classmethod
    def from_binding(cls, cupti) -> Layout:
        return cls(cupti.ActivityKind, {name: getattr(cupti, attr)
                                        for name, attr in _DTYPES.items()})


class CtypesBuffers:
    """CUPTI's buffer callbacks on libcupti through ctypes.

    Args:
        lib: libcupti as a ``ctypes.CDLL`` (tests pass a stand-in with the same three
            functions: ``cuptiActivityRegisterCallbacks``, ``cuptiActivityGetNextRecord``,
            ``cuptiGetResultString``).
        layout: the records' :class:`Layout`.
        buffer_bytes: bytes of each buffer handed to CUPTI.

    Raises:
        RuntimeError: CUPTI refused the callbacks (the text carries CUPTI's result name,
            e.g. ``CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED``).
    """

    _REQUEST = ctypes.CFUNCTYPE(None, ctypes.POINTER(ctypes.c_void_p),
                                ctypes.POINTER(ctypes.c_size_t),
                                ctypes.POINTER(ctypes.c_size_t))
    _COMPLETE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_uint32, ctypes.c_void_p,
                                 ctypes.c_size_t, ctypes.c_size_t)

    def __init__(self, lib, layout: Layout, buffer_bytes: int = 1 << 20,
                 flushing=lambda: False):
        self.lib, self.layout, self.buffer_bytes = lib, layout, buffer_bytes
        self._flushing = flushing      # True on a thread inside a flush (its CPU is its own)
        self._pool: dict[int, np.ndarray] = {}     # buffer address -> its memory
        self._free: list[int] = []
        self._lock = threading.Lock()
        self.done: collections.deque = collections.deque()   # copies, oldest first
        self.buffers = 0
        self.callback_cpu_s = 0.0
        self.slow_buffers = 0           # buffers walked by CUPTI (checks and mismatches)
        self.checked = 0
        self.mismatch: str | None = None
        self._names: dict[int, str] = {}
        self._request = self._REQUEST(self._on_request)
        self._complete = self._COMPLETE(self._on_complete)
        _ALIVE.append(self)   # CUPTI may call back (and hold buffers) for the process's life
        rc = lib.cuptiActivityRegisterCallbacks(self._request, self._complete)
        if rc:
            raise RuntimeError(f"cuptiActivityRegisterCallbacks: {self.result_name(rc)}")

    def result_name(self, rc: int) -> str:
        text = ctypes.c_char_p()
        try:
            self.lib.cuptiGetResultString(int(rc), ctypes.byref(text))
        except Exception:  # noqa: BLE001 (a name is a courtesy)
            return f"CUPTI result {rc}"
        return (text.value or b"").decode(errors="replace") or f"CUPTI result {rc}"

    # ---- CUPTI's threads ---------------------------------------------------------------
    def _on_request(self, buf, size, max_records) -> None:
        with self._lock:
            if self._free:
                addr = self._free.pop()
            else:
                mem = np.empty(self.buffer_bytes + 8, np.uint8)
                addr = (mem.ctypes.data + 7) & ~7     # CUPTI wants 8-byte alignment
                self._pool[addr] = mem
        buf[0] = addr
        size[0] = self.buffer_bytes
        max_records[0] = 0

    def _on_complete(self, context, stream, buf, size, valid) -> None:
        t0 = thread_time()
        try:
            if valid:
                self.done.append(ctypes.string_at(buf, valid))
            self.buffers += 1
        finally:
            with self._lock:
                if buf in self._pool:
                    self._free.append(buf)
            if not self._flushing():
                self.callback_cpu_s += thread_time() - t0

    # ---- the reader ----------------------------------------------------------------------
    def drain(self, names: bool = False) -> tuple[list[list[tuple]], int]:
        """Parse every buffer copied since the last call: per buffer the records as
        ``(external kind, correlation id, external id)`` and ``(kernel kind, correlation
        id, name, start ns, end ns)`` tuples, in buffer order; and the count of other
        records (API records)."""
        out, other = [], 0
        while self.done:
            data = self.done.popleft()
            if self.checked < _CHECKED_BUFFERS:
                self._check(data)
            walked = self._walk(data)
            if walked is None:
                self.slow_buffers += 1
                walked = self._walk_by_cupti(data)[:3]
            recs, n_other = self._records(data, *walked, names)
            out.append(recs)
            other += n_other
        return out, other

    def _walk(self, data: bytes):
        """Offsets of the kernel and external-correlation records (None: a kind of unknown
        size, or a record that runs past the end)."""
        if len(data) % 8:
            return None
        words = memoryview(data).cast("I")
        sizes = {k: s // 4 for k, s in self.layout.sizes.items()}
        kernel, external = self.layout.kernel, self.layout.external
        ks, es = [], []
        add_k, add_e = ks.append, es.append
        i, n, other = 0, len(words), 0
        get = sizes.get
        while i < n:
            kind = words[i]
            step = get(kind)
            if step is None:
                return None
            if kind == kernel:
                add_k(i * 4)
            elif kind == external:
                add_e(i * 4)
            else:
                other += 1
            i += step
        if i != n:
            return None
        return ks, es, other

    def _walk_by_cupti(self, data: bytes):
        """The same offsets, walked by ``cuptiActivityGetNextRecord`` (any record size),
        and every record's offset."""
        buf = ctypes.create_string_buffer(data, len(data))
        base = ctypes.addressof(buf)
        rec = ctypes.c_void_p()
        ks, es, other = [], [], 0
        kernel, external = self.layout.kernel, self.layout.external
        offsets = []
        while self.lib.cuptiActivityGetNextRecord(buf, ctypes.c_size_t(len(data)),
                                                  ctypes.byref(rec)) == 0:
            off = rec.value - base
            offsets.append(off)
            kind = int.from_bytes(data[off:off + 4], "little")
            if kind == kernel:
                ks.append(off)
            elif kind == external:
                es.append(off)
            else:
                other += 1
        return ks, es, other, offsets

    def _check(self, data: bytes) -> None:
        """Walk ``data`` both ways; where CUPTI's record sizes differ from the binding's,
        learn CUPTI's (and say so once)."""
        self.checked += 1
        fast = self._walk(data)
        *slow, offsets = self._walk_by_cupti(data)
        self.slow_buffers += 1
        if fast == tuple(slow):
            return
        offsets = offsets + [len(data)]
        learned = {}
        for a, b in zip(offsets, offsets[1:]):
            kind = int.from_bytes(data[a:a + 4], "little")
            learned.setdefault(kind, set()).add(b - a)
        sizes = dict(self.layout.sizes)
        for kind, seen in learned.items():
            if len(seen) == 1:
                sizes[kind] = seen.pop()
        self.mismatch = (f"record sizes by CUPTI's walk {sizes} differ from the binding's "
                         f"{self.layout.sizes}; using CUPTI's")
        self.layout.sizes = sizes

    def _records(self, data: bytes, ks: list, es: list, other: int, names: bool):
        lay = self.layout
        u64 = np.frombuffer(data, "<u8", count=len(data) // 8)
        u32 = np.frombuffer(data, "<u4", count=len(data) // 4)
        recs = []
        if es:
            e = np.asarray(es, np.int64)
            corr = u32[(e + lay.e_corr) >> 2].tolist()
            ext = u64[(e + lay.e_ext) >> 3].tolist()
            recs.extend(zip([lay.external] * len(es), corr, ext))
        if ks:
            k = np.asarray(ks, np.int64)
            corr = u32[(k + lay.k_corr) >> 2].tolist()
            start = u64[(k + lay.k_start) >> 3].astype(np.int64).tolist()
            end = u64[(k + lay.k_end) >> 3].astype(np.int64).tolist()
            if names:
                label = [self._name(p) for p in u64[(k + lay.k_name) >> 3].tolist()]
            else:
                label = [""] * len(ks)
            recs.extend(zip([lay.kernel] * len(ks), corr, label, start, end))
        return recs, other

    def _name(self, ptr: int) -> str:
        """A kernel's name (CUPTI keeps one string per kernel for the process's life)."""
        name = self._names.get(ptr)
        if name is None:
            name = ctypes.string_at(ptr).decode(errors="replace") if ptr else ""
            self._names[ptr] = name
        return name

    @property
    def pending(self) -> int:
        return len(self.done)
