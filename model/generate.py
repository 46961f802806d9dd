"""Generation: chunked prefill into the KV cache, then token-by-token sampling.

With linear attention the "cache" is the layer's constant-size recurrent state
(model/linear_state.py): prefill runs the chunked form from it, decoding one recurrent step
per token; this module does not tell the two apart.

Sampling follows the usual order: temperature, then top-k, then top-p (nucleus,
Holtzman et al. 2020) on the renormalised distribution; temperature 0 is greedy.
The same function runs without a cache (a full forward per token) so the two paths can
be compared; both fit the RoPE frequencies to prompt + max_new_tokens
(``fit_len``, see model/positional/rope.py).
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch

from ropelab.common.errors import ArgumentError, LengthError, NonFiniteOutput
from ropelab.model.transformer import Transformer


def sample_next(logits: torch.Tensor, temperature: float = 1.0, top_k: Optional[int] = None,
                top_p: Optional[float] = None, generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """Next token ids (B,) from last-position logits (B, V)."""
    logits = logits.float()
    if temperature == 0:
        return logits.argmax(dim=-1)
    logits = logits / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        # Drop a token when the tokens ranked above it already reach top_p; the first stays.
        drop_sorted = (cumulative - sorted_logits.softmax(dim=-1)) >= top_p
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    probs = logits.softmax(dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def _check_args(temperature: float, top_k: Optional[int], top_p: Optional[float], max_new_tokens: int) -> None:
    if temperature < 0:
        raise ArgumentError(f"temperature must be >= 0 (0 = greedy), got {temperature}")
    if top_k is not None and top_k < 1:
        raise ArgumentError(f"top_k must be >= 1, got {top_k}")
    if top_p is not None and not 0 < top_p <= 1:
        raise ArgumentError(f"top_p must be in (0, 1], got {top_p}")
    if max_new_tokens < 0:
        raise ArgumentError(f"max_new_tokens must be >= 0, got {max_new_tokens}")


@torch.no_grad()
def generate(model: Transformer, prompt: torch.Tensor | Sequence[int], max_new_tokens: int, *,
             temperature: float = 1.0, top_k: Optional[int] = None, top_p: Optional[float] = None,
             seed: Optional[int] = None, eos_id: Optional[int] = None, use_cache: bool = True,
             prefill_chunk: Optional[int] = None, max_len: Optional[int] = None) -> torch.Tensor:
    """Continue ``prompt`` ((B, T) or a list of ids) by up to ``max_new_tokens`` tokens.

    Returns (B, T + n) ids. A sequence that produced ``eos_id`` is padded with it while
    others continue; generation stops early once all have. ``max_len`` caps
    prompt + new tokens (the cache size); exceeding it, or what the positional encoding
    can serve, raises LengthError before any work is done.
    """
    _check_args(temperature, top_k, top_p, max_new_tokens)
    device = next(model.parameters()).device
    tokens = torch.as_tensor(prompt, dtype=torch.long, device=device)
    tokens = tokens[None] if tokens.dim() == 1 else tokens
    B, T = tokens.shape
    if T == 0:
        raise ArgumentError("the prompt is empty: give at least one token (e.g. the end-of-text token)")
    total = T + max_new_tokens
    if max_len is not None and total > max_len:
        raise LengthError(f"prompt ({T} tokens) + max_new_tokens ({max_new_tokens}) = {total} "
                          f"exceeds max_len={max_len}; shorten the prompt or ask for fewer tokens")
    model.check_length(total)
    generator = None
    if seed is not None:
        generator = torch.Generator(device=device).manual_seed(seed)
    was_training = model.training
    model.eval()
    try:
        if use_cache:
            model.setup_cache(B, total)
        return _decode(model, tokens, total, temperature, top_k, top_p, generator, eos_id,
                       use_cache, prefill_chunk or T)
    finally:
        model.clear_cache()
        model.train(was_training)


def _decode(model, tokens, total, temperature, top_k, top_p, generator, eos_id, use_cache, chunk):
    B, T = tokens.shape
    device = tokens.device
    out = torch.empty(B, total, dtype=torch.long, device=device)
    out[:, :T] = tokens
    finished = torch.zeros(B, dtype=torch.bool, device=device)
    logits = None
    if use_cache:
        for start in range(0, T, chunk):  # chunked prefill, at positions the host knows
            logits = model(tokens[:, start:start + chunk], start=start)[:, -1]
    for t in range(T, total):
        if not use_cache:
            logits = model(out[:, :t], fit_len=total)[:, -1]
        if not bool(torch.isfinite(logits).all()):  # multinomial would fail on them, argmax pick token 0
            raise NonFiniteOutput(f"the next-token logits at position {t} are not finite")
        nxt = sample_next(logits, temperature, top_k, top_p, generator)
        if eos_id is not None:
            nxt = torch.where(finished, torch.full_like(nxt, eos_id), nxt)
            finished |= nxt == eos_id
        out[:, t] = nxt
        if eos_id is not None and bool(finished.all()):
            return out[:, : t + 1]
        if use_cache and t + 1 < total:
            logits = model(nxt[:, None], start=t)[:, -1]
    return out
