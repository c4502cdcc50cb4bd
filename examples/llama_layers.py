"""A Llama-like decoder layer stack for the examples and tests: attention (q/k/v/o), SwiGLU MLP
(gate/up/down, named g/u/d), RMSNorm, run with `scan_layers`, sharded FSDP x TP.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

# Megatron-style 2D specs on weights [out, in]: column-parallel in, row-parallel out.
PARTITION_SPECS = {
    "q.weight": ("tp", "fsdp"), "k.weight": ("tp", "fsdp"), "v.weight": ("tp", "fsdp"), "o.weight": ("fsdp", "tp"),
    "g.weight": ("tp", "fsdp"), "u.weight": ("tp", "fsdp"), "d.weight": ("fsdp", "tp"),
}  # fmt: skip
# Hidden states [batch, seq, dim]: batch over fsdp, model dim over tp.
ACTIVATION_SPEC = ("fsdp", None, "tp")


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class LlamaLayer(nn.Module):
    def __init__(self, dim: int, hidden: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v, self.o = (nn.Linear(dim, dim, bias=False) for _ in range(4))
        self.g, self.u = nn.Linear(dim, hidden, bias=False), nn.Linear(dim, hidden, bias=False)
        self.d = nn.Linear(hidden, dim, bias=False)
        self.n1, self.n2 = RMSNorm(dim), RMSNorm(dim)
        self.mesh: object | None = None  # set by `shard_model`: activations are kept (fsdp, None, tp)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, dim = x.shape
        h = self.n1(x)

        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.view(b, s, self.heads, dim // self.heads).transpose(1, 2)

        q, k, v = heads(self.q(h)), heads(self.k(h)), heads(self.v(h))
        scores = q @ k.transpose(-1, -2) / math.sqrt(dim // self.heads)
        causal = torch.ones(s, s, device=x.device, dtype=torch.bool).tril()
        scores = scores.masked_fill(~causal, float("-inf"))
        attn = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, s, dim)
        x = x + self.o(attn)
        h = self.n2(x)
        out = x + self.d(F.silu(self.g(h)) * self.u(h))
        if self.mesh is not None:
            import torch_xla.distributed.spmd as xs

            out = xs.mark_sharding_with_gradients(out, self.mesh, ACTIVATION_SPEC)
        return out


class LlamaStack(nn.Module):
    def __init__(self, layers: int, dim: int, hidden: int, heads: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(LlamaLayer(dim, hidden, heads) for _ in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from scan_runtime import scan_layers

        return scan_layers(self.layers, x)


def shard_model(model: LlamaStack, mesh: object) -> None:
    """`mark_sharding` every weight with its 2D spec; norms stay replicated."""
    import torch_xla.distributed.spmd as xs

    for name, p in model.named_parameters():
        spec = PARTITION_SPECS.get(name.split(".", 2)[-1])
        if spec is not None:
            xs.mark_sharding(p, mesh, spec)
    for layer in model.layers:
        layer.mesh = mesh


def loss_of(model: LlamaStack, x: torch.Tensor) -> torch.Tensor:
    return model(x).pow(2).mean()


def sgd_step(model: LlamaStack, x: torch.Tensor, lr: float = 0.05) -> torch.Tensor:
    """One plain SGD step (forward, backward, update, then run the graph); returns the loss."""
    import torch_xla

    for p in model.parameters():
        p.grad = None
    loss = loss_of(model, x)
    loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            p -= lr * p.grad
    torch_xla.sync()
    return loss
