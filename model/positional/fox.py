"""The Forgetting Transformer's forget gate (Lin et al., ICLR 2025, "Forgetting Transformer:
Softmax Attention with a Forget Gate", arXiv:2503.02130).

No positional encoding in the usual sense: each layer learns, per head and token, a forget
gate f_t = σ(w_fᵀx_t + b_f) from the layer's input x_t, and the score of query i and key
j ≤ i gains

    D_ij = Σ_{l=j+1}^{i} log f_l = c_i − c_j,     c_t = Σ_{l≤t} log f_l,

so attention decays with what the model chose to forget between key and query, not with
the distance itself. ``log_forget`` gives log f (the layer's input to it, its gate); the
running sum c is attention's (model/attention.py), kept in the KV cache for decoding
(model/kv_cache.py). This is the basic FoX (the paper's "FoX (LLaMA)": LLaMA with RoPE
replaced by the gate); the "Pro" additions (QK-norm, an output gate and norm, a
data-dependent shift of k and v) are not part of it. Initialisation as the authors' code:
w_f ~ N(0, 0.02), b_f = 0, so every gate starts near 1/2.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ropelab.model.config import ModelConfig
from ropelab.model.positional.base import PositionalEncoding

Tensor = torch.Tensor
GATE_INIT_STD = 0.02  # the authors' initializer range for the gate projection


class ForgetGate(PositionalEncoding):
    """Per-layer forget gates: ``log_forget(layer, x)`` is log σ(W_f x + b_f), (B, H, T)."""

    kind = "fox"
    decays = True

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gates = nn.ModuleList(nn.Linear(cfg.d_model, cfg.n_heads, bias=True) for _ in range(cfg.n_layers))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for gate in self.gates:
            nn.init.normal_(gate.weight, mean=0.0, std=GATE_INIT_STD)
            nn.init.zeros_(gate.bias)

    def log_forget(self, layer: int, x: Tensor) -> Tensor:
        return F.logsigmoid(self.gates[layer](x).float()).transpose(1, 2)  # (B, H, T)
