"""The decoder: token embedding → pre-norm blocks → RMSNorm → LM head.

Layers may differ (a layer plan, model/layer_config.py): the model holds one encoding per
distinct ``pos`` of its layer types (``pos`` for the default layer's, ``layer_pos`` for the
others), prepares each one's context once per forward, and hands every block the context
of its own layer (its index and its window). A uniform model is the plan with one type:
one encoding, ``pos``, as always.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
from torch import nn

from ropelab.common.errors import ArgumentError
from ropelab.model.attention import Attention
from ropelab.model.config import ModelConfig
from ropelab.model.layer_config import LayerType
from ropelab.model.layers import RMSNorm, SwiGLU
from ropelab.model.linear_attention import LinearAttention
from ropelab.model.loss import linear_cross_entropy
from ropelab.model.positional import PositionalEncoding, PositionContext, build_positional

# ``model.attention`` -> the layer; keys are exactly model.config.ATTENTION_KINDS (tests/integration/test_linear_attention.py).
ATTENTIONS: dict[str, type[nn.Module]] = {"softmax": Attention, "linear": LinearAttention}


class Block(nn.Module):
    """x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, cfg: ModelConfig, layer: LayerType):
        super().__init__()
        self.layer = layer  # its type in the layer plan (window, sinks, temperature, encoding)
        self.attn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.attn = ATTENTIONS[cfg.attention](cfg, layer)
        self.mlp_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.mlp = SwiGLU(cfg)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor, ctx: PositionContext) -> torch.Tensor:
        x = x + self.drop(self.attn(self.attn_norm(x), ctx))
        return x + self.drop(self.mlp(self.mlp_norm(x)))


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos = build_positional(cfg)  # the default layer's encoding (model.pos)
        # One encoding per other distinct pos of the plan's layer types, under the first type
        # that uses it; ``encoding_of`` names each block's ("" for ``pos``).
        self.layer_pos = nn.ModuleDict()
        self.encoding_of: list[str] = []
        for name, layer in zip(cfg.layer_names(), cfg.layer_types()):
            if layer.pos == cfg.pos:
                self.encoding_of.append("")
                continue
            shared = next((n for n, e in self.layer_pos.items() if e.pos_config == layer.pos), None)
            if shared is None:
                self.layer_pos[name] = build_positional(cfg.for_layer_type(layer))
                self.layer_pos[name].pos_config = layer.pos
                shared = name
            self.encoding_of.append(shared)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg, layer) for layer in cfg.layer_types())
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.head.weight = self.tok_emb.weight
        self.reset_parameters()

    def forward(self, idx: torch.Tensor, positions: Optional[torch.Tensor] = None, *,
                start: int = 0, fit_len: Optional[int] = None, targets: Optional[torch.Tensor] = None,
                reduction: str = "mean", first_target: int = 0,
                target_weights: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Logits (B, T, vocab) for tokens ``idx`` (B, T) at ``positions``, default start … start+T−1.

        ``positions`` is (T,), shared by the batch, or (B, T), ascending per sequence (the
        training path's randomized positions; not with a KV cache). Without it the positions
        follow ``start`` (a host integer: a KV cache then writes there without reading the
        device, as generation does).

        ``fit_len`` is the length of the whole sequence (dynamic NTK fits its frequencies
        to it): by default the attached KV cache's size, else this forward's last position
        + 1. With ``targets`` (B, T) the result is the cross-entropy instead (mean, or per
        target with ``reduction="none"``), never materialising the logits (model/loss.py).
        ``first_target`` (with ``reduction="none"``): only targets from that index on are
        scored, the earlier ones read 0 and their positions skip the final norm and the head
        (evaluation windows whose first positions are context only: sliding, same-tokens).
        ``target_weights`` (B, T), with the mean: a weighted mean instead (model/loss.py), as
        ``data.mix.loss_share`` asks of a mixed batch.
        """
        if first_target and (targets is None or reduction != "none"):
            raise ValueError("first_target needs targets and reduction='none'")
        # The positions served are known on the host: no layer reads them back from the
        # device, and the default path has no data-dependent call to split a compiled graph.
        first = None
        if positions is None:
            first, end = start, start + idx.shape[1]
            positions = torch.arange(start, end, device=idx.device)
        else:
            if positions.dim() == 2 and self.cache_max_len() is not None:
                raise ArgumentError("per-sequence positions (B, T) are for the training path; a KV "
                                    "cache takes one position vector (T,) for the whole batch")
            end = int(positions.max()) + 1
        self.check_length(end)  # learned: a clear LengthError, never an index error
        contexts = self.contexts(positions, max(fit_len or self.cache_max_len() or end, end), first)
        x = self.drop(self.pos.embed(self.tok_emb(idx), positions))  # (B, T, d)
        for block, ctx in zip(self.blocks, contexts):
            x = block(x, ctx)
        if first_target:
            nll = linear_cross_entropy(self.norm(x[:, first_target:]), self.head.weight,
                                       targets[:, first_target:], reduction)
            return torch.nn.functional.pad(nll, (first_target, 0))
        x = self.norm(x)
        if targets is not None:
            return linear_cross_entropy(x, self.head.weight, targets, reduction, target_weights)
        return self.head(x)  # (B, T, vocab)

    def encodings(self) -> list[PositionalEncoding]:
        """Every distinct encoding of the model, the default layer's first."""
        return [self.pos, *self.layer_pos.values()]

    def encoding(self, layer: int) -> PositionalEncoding:
        """The encoding block ``layer`` uses."""
        name = self.encoding_of[layer]
        return self.layer_pos[name] if name else self.pos

    @property
    def max_len(self) -> Optional[int]:
        """The most positions every layer's encoding serves (a learned table, xPos), or None."""
        limits = [e.max_len for e in self.encodings() if e.max_len is not None]
        return min(limits) if limits else None

    def check_length(self, n_positions: int) -> None:
        """Raise LengthError if some layer's encoding cannot serve positions 0 … n_positions−1."""
        for encoding in self.encodings():
            encoding.check_length(n_positions)

    def contexts(self, positions: torch.Tensor, fit_len: int, first: Optional[int] = None) -> list[PositionContext]:
        """Each block's context for one forward: each encoding's prepared once (gathered
        cos/sin, bias functions), then given each block's index and window."""
        firsts = {name: i for i, name in reversed(list(enumerate(self.encoding_of)))}  # a layer of each
        prepared = {name: self.encoding(i).context(positions, fit_len, first) for name, i in firsts.items()}
        return [prepared[name].for_layer(i, block.layer.window)
                for i, (name, block) in enumerate(zip(self.encoding_of, self.blocks))]

    # --- initialisation -------------------------------------------------------------
    def reset_parameters(self) -> None:
        """N(0, init_std) everywhere; residual output projections scaled by 1/√(2·n_layers).

        The scaling keeps the residual stream's variance independent of depth (GPT-2,
        Radford et al. 2019 §2.3; also LLaMA/OLMo-style inits).
        """
        std = self.cfg.init_std
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=std)
            elif isinstance(module, RMSNorm):
                nn.init.ones_(module.weight)
        for block in self.blocks:
            for proj in (block.attn.wo, block.mlp.w2):
                nn.init.normal_(proj.weight, mean=0.0, std=std / math.sqrt(2 * self.cfg.n_layers))
            if hasattr(block.attn, "reset_parameters"):
                block.attn.reset_parameters()  # sinks, a temperature: their own init
        for encoding in self.encodings():
            encoding.reset_parameters()  # an encoding's own parameters keep their paper's init

    # --- KV cache -------------------------------------------------------------------
    def setup_cache(self, batch_size: int, max_len: int, dtype: Optional[torch.dtype] = None,
                    device: Optional[torch.device] = None) -> None:
        """Attach a cache for ``max_len`` positions to every attention layer: a preallocated
        KV cache (softmax), or a constant-size recurrent state (linear; model/linear_state.py)."""
        self.check_length(max_len)
        weight = self.tok_emb.weight
        for i, block in enumerate(self.blocks):
            block.attn.cache = block.attn.new_cache(batch_size, max_len, dtype or weight.dtype,
                                                    device or weight.device, block.layer.window,
                                                    self.encoding(i).decays)

    def clear_cache(self) -> None:
        for block in self.blocks:
            block.attn.cache = None

    def cache_max_len(self) -> Optional[int]:
        """Positions the attached KV cache holds (the sequence's planned length), or None."""
        cache = self.blocks[0].attn.cache
        return None if cache is None else cache.max_len

    # --- accounting -----------------------------------------------------------------
    def num_params(self, exclude_embeddings: bool = False) -> int:
        """Unique parameters (a tied head counts once); optionally without lookup tables."""
        params = {id(p): p for p in self.parameters()}
        if exclude_embeddings:
            # With a tied head the embedding is the head too; both go (Kaplan et al. 2020).
            params.pop(id(self.tok_emb.weight), None)
            if isinstance(getattr(self.pos, "table", None), nn.Embedding):
                params.pop(id(self.pos.table.weight), None)
        return sum(p.numel() for p in params.values())

    def flops_per_token(self, seq_len: int, training: bool = True) -> float:
        """Matmul FLOPs per token: 2·N_matmul + each layer's attention, forward (×3 for training).

        N_matmul counts every Linear weight including the LM head (a tied head is still a
        matmul). Each attention kind counts its own core: softmax 4·d_attn·T (QKᵀ and AV over
        T keys without the causal halving, the convention of PaLM, Chowdhery et al. 2022,
        App. B, and nanoGPT's MFU); linear attention its chunks and states, independent of T
        beyond one chunk (model/linear_attention.py).
        """
        n_matmul = sum(m.weight.numel() for m in self.modules() if isinstance(m, nn.Linear))
        attn = sum(block.attn.flops_per_token(seq_len, block.layer.window) for block in self.blocks)
        forward = 2 * n_matmul + attn
        return 3 * forward if training else forward
