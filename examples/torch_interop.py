"""Calling ``adaptive.launch`` from PyTorch code: torch tensors in, torch tensors out.

    python examples/torch_interop.py

On a GPU the tensors stay on the device (CUDA backend, the caller's current stream); on
a machine without one, CPU tensors run on the host backend. Each result is checked
against the PyTorch op it replaces.
"""

from __future__ import annotations

import sys

try:
    import torch
    import torch.nn.functional as F
except ModuleNotFoundError as exc:
    if exc.name != "torch":
        raise
    print("torch_interop.py needs PyTorch: pip install 'adaptive-dispatch[llm]' (or torch); "
          "skipped")
    sys.exit(0)

import adaptive


class AdaptiveLinear(torch.nn.Module):
    """``nn.Linear`` (no bias) for inference whose matmul goes through ``adaptive.launch``."""

    def __init__(self, linear: torch.nn.Linear):
        super().__init__()
        # adaptive's gemm is a[M, K] @ b[K, N]: keep the weight transposed, contiguous, once
        self.register_buffer("w_t", linear.weight.detach().t().contiguous())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return adaptive.launch("gemm", x.contiguous(), self.w_t)


def check(name: str, got: torch.Tensor, want: torch.Tensor, tol: float) -> None:
    assert type(got) is torch.Tensor and got.device == want.device, (type(got), got.device)
    err = float((got.float() - want.float()).norm() / want.float().norm())
    print(f"{name:<30} {tuple(got.shape)!s:<16} {got.dtype}  rel. error {err:.1e}")
    assert err < tol, f"{name}: relative error {err} above {tol}"


@torch.inference_mode()
def main() -> int:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.float16 if device == "cuda" else torch.float32
    tol = 1e-2 if dtype == torch.float16 else 1e-4
    torch.manual_seed(0)
    print(f"device {device}, dtype {dtype}\n")

    a = torch.randn(333, 256, device=device, dtype=dtype)
    b = torch.randn(256, 129, device=device, dtype=dtype) / 16
    check("gemm", adaptive.launch("gemm", a, b), a @ b, tol)

    x = torch.randn(64, 1000, device=device, dtype=dtype)
    check("softmax", adaptive.launch("softmax", x), torch.softmax(x.float(), -1), tol)

    q, k, v = (torch.randn(2, 4, 77, 64, device=device, dtype=dtype) for _ in range(3))
    check("attention (causal)", adaptive.launch("attention", q, k, v, causal=True),
          F.scaled_dot_product_attention(q, k, v, is_causal=True), tol)

    dense = torch.randn(512, 256, device=device, dtype=dtype)
    dense[torch.rand(512, 256, device=device) > 0.1] = 0          # 90 % pruned
    w = adaptive.SparseWeight(dense)                               # formats built once
    check("spmm (pruned weight)", adaptive.launch("spmm", w, b), dense @ b, tol)

    model = torch.nn.Sequential(torch.nn.Linear(256, 512, bias=False), torch.nn.GELU(),
                                torch.nn.Linear(512, 256, bias=False)).to(device, dtype)
    fast = torch.nn.Sequential(AdaptiveLinear(model[0]), torch.nn.GELU(),
                               AdaptiveLinear(model[2]))
    check("nn.Module with AdaptiveLinear", fast(a), model(a), tol)

    out = torch.empty(333, 129, device=device, dtype=dtype)        # write into your buffer
    assert adaptive.launch("gemm", a, b, out=out) is out
    print("\n" + str(adaptive.explain("gemm", a, b)))       # what was chosen, and why
    return 0


if __name__ == "__main__":
    sys.exit(main())
