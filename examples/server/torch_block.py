"""The same block in plain PyTorch: what most users would run instead of ``adaptive``.

SDPA for attention, ``torch.matmul`` for the projections, ``torch.softmax`` for the head,
and the pruned MLP weights either dense (zeros kept, the common case) or as
``torch.sparse`` CSR tensors. Imported only by ``--dispatch torch``.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from block import BlockShape, make_weights


class TorchBlock:
    """Args: shape, device ("host" runs on the CPU, "cuda" on the GPU), dtype, seed, and
    sparse=True to hold the pruned weights as ``torch.sparse_csr`` tensors."""

    def __init__(self, shape: BlockShape, device: str = "cuda", dtype: str = "float16",
                 seed: int = 0, sparse: bool = False):
        if device not in ("host", "cuda"):
            raise ValueError(f"device must be 'host' or 'cuda', got {device!r}")
        self.shape, self.sparse = shape, sparse
        self.device = torch.device("cpu" if device == "host" else "cuda")
        self.dtype = getattr(torch, dtype)
        self.host_weights = make_weights(shape, seed)
        self.w = {}
        for name, value in self.host_weights.items():
            t = torch.from_numpy(value.copy()).to(self.device, self.dtype)   # weights are read-only
            if sparse and name.rsplit(".", 1)[-1] in ("w_up", "w_down"):
                t = t.to_sparse_csr()
            self.w[name] = t

    def _mm(self, w, x):
        return torch.sparse.mm(w, x) if self.sparse else w @ x

    @torch.inference_mode()
    def forward(self, x):
        s = self.shape
        p, d, heads = x.shape[0], s.d_model, s.heads
        for i in range(s.layers):
            h = F.layer_norm(x, (d,))
            qkv = (h @ self.w[f"{i}.w_qkv"]).view(p, 3, heads, d // heads).permute(1, 2, 0, 3)
            a = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], is_causal=True)
            x = x + a.transpose(0, 1).reshape(p, d) @ self.w[f"{i}.w_o"]
            u = F.gelu(self._mm(self.w[f"{i}.w_up"], F.layer_norm(x, (d,)).T.contiguous()),
                       approximate="tanh")
            x = x + self._mm(self.w[f"{i}.w_down"], u).T
        return x, torch.softmax(x @ self.w["w_head"], dim=-1)

    def __call__(self, x_host: np.ndarray) -> tuple[float, int, float]:
        """Run one request's activations [L, d]; (norm of valid rows, argmax, its prob)."""
        seq_len = x_host.shape[0]
        padded = np.zeros((self.shape.padded(seq_len), self.shape.d_model), np.float32)
        padded[:seq_len] = x_host
        x = torch.from_numpy(padded).to(self.device, self.dtype)
        x, probs = self.forward(x)
        with torch.inference_mode():   # one copy back (as the adaptive block's summary)
            prob, token = probs[seq_len - 1].float().max(0)
            norm = torch.linalg.vector_norm(x[:seq_len].float())
            norm, token, prob = torch.stack([norm, token.float(), prob]).tolist()
        return norm, int(token), prob
