"""Memory a command will need, checked against what the device has, before anything large is built.

Every entry point that builds large tensors asks this module first: training (one forward
and backward of a micro-batch, with the weights, gradients and AdamW's moments), evaluation
(one forward of the widest batch of windows or task instances, and the instances
themselves), generation (the KV cache) and the attention diagnostics (attention maps). A
request that cannot fit is refused with the estimate and the limit (``MemoryLimitError``,
exit 2) instead of running until the kernel's out-of-memory killer ends it, and the
processes beside it.

Estimates come from the model config and the shapes alone, before any allocation, and
count in float32 bytes (autocast's bf16 activations are counted as float32 too). They were
calibrated against the peak resident memory of CPU runs of every kind of encoding
(d_model 64-256, lengths 512-32768), and exceed it by up to 5× (``RUNTIME`` included), by
as little as 1.02× (a RoPE training step at d_model 256, 8 × 512 tokens). On CUDA, where
autocast keeps activations in bf16, they are not calibrated and likely high: there a request
is refused only when its estimate exceeds the free memory ``CUDA_MARGIN`` times (no such
machine exists for it); between 1× and that, the command says so and goes ahead, and if the
device does run out, torch's out-of-memory error ends it with exit 2 and a message
(common/cli.py ``entry_point``), not the kernel's out-of-memory killer, which only ends
processes for host memory.

- weights: the parameters of the config (``parameter_count``), 4 bytes each; training adds
  their gradients and AdamW's two moments (16 bytes per parameter in all);
- activations per token and layer: the block's inputs and norms (8·d), q (2×) and k, v (3×
  the kv width) and the SwiGLU's four hidden-width tensors; training keeps every layer's
  for backward, and backward their gradients (2×); a forward without gradients one layer's;
- score blocks, for encodings whose attention forms them (a score bias, CoPE's contextual
  bias): per head and (query, key) pair of a query chunk, ``SCORE_FLOATS`` float32 values
  (``CONTEXTUAL_FLOATS``, per sequence, for a contextual bias), plus ``TRAINED_BIAS_BYTES``
  per pair for a bias computed from trained parameters (a bucket table, an MLP of the
  distance); every chunk of every layer is kept for backward in training;
- the LM head: chunks of logits (model/loss.py) for a loss, the full (B, T, vocab) logits
  where a command reads them (task scoring, the prefill of generation);
- what the command keeps besides: task instances, a synthetic validation set, the KV cache;
- ``RUNTIME``: the framework's own working memory (kernel scratch, the allocator).

The limit is what the device has free now: ``torch.cuda.mem_get_info`` on CUDA; on the CPU
the smaller of MemAvailable (/proc/meminfo) and the cgroup's limit minus its usage (v2
memory.max, v1 memory.limit_in_bytes). Where none can be read (macOS, MPS) nothing is
checked.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

from ropelab.common.errors import UserError
from ropelab.common.logs import get_logger
from ropelab.configs.schema import RunConfig
from ropelab.model.config import ModelConfig
from ropelab.model.encodings import KINDS, served_length
from ropelab.model.loss import CHUNK_BYTES

logger = get_logger(__name__)

FLOAT = 4  # bytes: weights and activations are counted as float32
QUERY_CHUNK = 512  # queries per chunk on attention's masked path (model/attention.py)
# float32 values per head and (query, key) pair: a bias, its masked form and the kernel's
# scores; a contextual bias (CoPE) also forms logits, gates, counts and its interpolation
# (model/positional/cope.py). A trained bias adds its own intermediates per pair.
SCORE_FLOATS, CONTEXTUAL_FLOATS, TRAINED_BIAS_BYTES = 4, 16, 384
RUNTIME = 128e6  # bytes: the framework's own working memory
# On CUDA the estimates are uncalibrated (above); the most they exceeded a CPU run's peak by.
CUDA_MARGIN = 5.0
MEMINFO = Path("/proc/meminfo")
CGROUP_V2, CGROUP_V1 = Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/memory")


class MemoryLimitError(UserError):
    """A request whose estimated memory exceeds what the device has; nothing was allocated."""


@dataclass(frozen=True)
class Estimate:
    """The bytes a command will hold at its peak, by part, and what it is (for the message)."""

    what: str  # e.g. "training at train.batch_size=16 × train.seq_len=128"
    parts: tuple[tuple[str, float], ...]  # (part, bytes), largest first once built

    @property
    def total(self) -> float:
        return sum(size for _, size in self.parts)

    def describe(self) -> str:
        shown = sorted(((name, size) for name, size in self.parts if size > 0), key=lambda p: -p[1])
        return f"about {human(self.total)} of memory ({', '.join(f'{name} {human(size)}' for name, size in shown[:4])})"


def human(size: float) -> str:
    """Bytes as B, KB, MB, GB, TB or PB (powers of 1000), three significant digits."""
    for unit, scale in (("PB", 1e15), ("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if size >= scale:
            return f"{size / scale:.3g} {unit}"
    return f"{size:.0f} B"


# --------------------------------------------------------------- the model's own sizes

def parameter_count(m: ModelConfig) -> int:
    """The parameters of ``Transformer(m)``, from the config alone (an encoding's own small
    parameters aside, but a learned position table counted)."""
    d, q, kv = m.d_model, m.n_heads * m.head_dim, m.kv_heads * m.head_dim
    block = d * (q + 2 * kv) + q * d + 3 * d * m.hidden_dim + 2 * d
    embeddings = m.vocab_size * d * (1 if m.tie_embeddings else 2)
    table = (served_length(m.pos) or 0) * d if KINDS[m.pos.kind].sized_by_max_len else 0
    return embeddings + m.n_layers * block + d + table


def _layer_elements(m: ModelConfig) -> int:
    """Elements one block keeps per token for backward (see the module docstring)."""
    q, kv = m.n_heads * m.head_dim, m.kv_heads * m.head_dim
    return 8 * m.d_model + 2 * q + 3 * kv + 4 * m.hidden_dim


def _pair_bytes(m: ModelConfig) -> float:
    """Bytes per (query, key) pair of a score block (0: a fused kernel forms no scores)."""
    row = KINDS[m.pos.kind]
    if m.attention != "softmax" or not row.forms_scores:
        return 0.0
    if row.contextual:
        return CONTEXTUAL_FLOATS * m.n_heads * FLOAT
    return SCORE_FLOATS * m.n_heads * FLOAT + (TRAINED_BIAS_BYTES if row.trained else 0)


def _scores(m: ModelConfig, batch: int, length: int, training: bool, per_sequence: bool) -> float:
    """Bytes of score blocks: one query chunk's in a forward; every chunk of every layer kept
    for backward in training (keys after a chunk are dropped, so about half of T²)."""
    # A bias of positions alone is shared by the batch; a contextual one, or per-sequence
    # positions, is per sequence.
    rows = batch if (per_sequence or KINDS[m.pos.kind].contextual) else 1
    if training:
        pairs = length * (length + QUERY_CHUNK) / 2 * m.n_layers
    else:
        pairs = min(length, QUERY_CHUNK) * length
    return _pair_bytes(m) * rows * pairs


def _head(m: ModelConfig, tokens: int, full_logits: bool) -> float:
    """The LM head: all logits, or the loss's chunks of them (model/loss.py)."""
    return tokens * m.vocab_size * FLOAT * (1 if full_logits else 0) + 3 * CHUNK_BYTES


# --------------------------------------------------------------- what each command holds

def training_estimate(m: ModelConfig, batch: int, seq_len: int, per_sequence_positions: bool = False,
                      kept: tuple[tuple[str, float], ...] = ()) -> Estimate:
    """One optimizer step over micro-batches of ``batch`` × ``seq_len`` tokens (``kept``: what
    the trainer holds besides, e.g. a synthetic validation set)."""
    params, tokens = parameter_count(m), batch * seq_len
    activations = tokens * (2 * m.n_layers * _layer_elements(m) + 4 * m.d_model) * FLOAT
    return Estimate(f"training at train.batch_size={batch} × train.seq_len={seq_len}", (
        ("runtime", RUNTIME), ("weights, gradients and optimizer state", 16 * params),
        ("activations", activations),
        ("attention scores", _scores(m, batch, seq_len, True, per_sequence_positions)),
        ("LM head", _head(m, tokens, False)), *kept))


def forward_estimate(m: ModelConfig, batch: int, length: int, what: str, full_logits: bool = False,
                     kept: tuple[tuple[str, float], ...] = ()) -> Estimate:
    """One forward without gradients over ``batch`` × ``length`` tokens (evaluation, scoring)."""
    tokens = batch * length
    activations = tokens * (_layer_elements(m) + 4 * m.d_model) * FLOAT
    return Estimate(what, (("runtime", RUNTIME), ("weights", FLOAT * parameter_count(m)), ("activations", activations),
                           ("attention scores", _scores(m, batch, length, False, False)),
                           ("LM head", _head(m, tokens, full_logits)), *kept))


def decoding_estimate(m: ModelConfig, batch: int, prompt: int, total: int, what: str) -> Estimate:
    """Generation: the KV cache for ``total`` positions (a constant state for linear
    attention) and the prefill of ``prompt`` tokens."""
    if m.attention == "softmax":
        cache = 2 * m.n_layers * batch * m.kv_heads * total * m.head_dim * FLOAT
    else:
        cache = m.n_layers * batch * m.n_heads * m.head_dim * (m.head_dim + 1) * FLOAT
    prefill = forward_estimate(m, batch, prompt, what, full_logits=True)
    return Estimate(what, (*prefill.parts, ("KV cache", cache)))


def attention_map_estimate(m: ModelConfig, length: int, windows: int, what: str) -> Estimate:
    """The attention diagnostics at one length: one window's forward, every layer's input
    kept, and a layer's full (H, T, T) probabilities with the intermediates measured from
    them; the windows' tokens and per-window results."""
    forward = forward_estimate(m, 1, length, what)
    maps = 2 * SCORE_FLOATS * m.n_heads * length * length * FLOAT
    inputs = m.n_layers * length * m.d_model * FLOAT
    kept = windows * (length * 8 + m.n_layers * m.n_heads * length * FLOAT)
    return Estimate(what, (*forward.parts, ("attention maps", maps), ("layer inputs", inputs),
                           ("windows and results", kept)))


# --------------------------------------------------------------- the limit and the check

def _read_int(path: Path) -> Optional[int]:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _meminfo_available() -> Optional[int]:
    try:
        for line in MEMINFO.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024  # kB
    except (OSError, ValueError, IndexError):
        return None
    return None


def _cgroup_available() -> Optional[int]:
    """The cgroup's limit minus its usage (v2, else v1), or None without a limit."""
    for limit_file, usage_file in ((CGROUP_V2 / "memory.max", CGROUP_V2 / "memory.current"),
                                   (CGROUP_V1 / "memory.limit_in_bytes", CGROUP_V1 / "memory.usage_in_bytes")):
        limit, usage = _read_int(limit_file), _read_int(usage_file)
        if limit is not None and usage is not None and limit < 1 << 60:  # v1 writes ~2^63 for none
            return max(0, limit - usage)
    return None


def available_memory(device: torch.device | str) -> Optional[tuple[int, str]]:
    """(bytes free for this process now, where that figure comes from), or None where it cannot be read."""
    device = torch.device(device)
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free), f"free on {device} (torch.cuda.mem_get_info)"
    if device.type != "cpu":
        return None
    found = [(value, source) for value, source in (
        (_meminfo_available(), "MemAvailable in /proc/meminfo"),
        (_cgroup_available(), "the cgroup's memory limit minus its usage")) if value is not None]
    return min(found) if found else None


def check_fits(estimate: Estimate, device: torch.device | str, fix: str) -> None:
    """Raise MemoryLimitError (with the estimate, the limit and ``fix``) when ``estimate``
    exceeds what ``device`` has free; nothing happens where the limit cannot be read."""
    limit = available_memory(device)
    if limit is None or estimate.total <= limit[0]:
        return
    free, source = limit
    found = (f"{estimate.what} needs {estimate.describe()}, but {torch.device(device)} has "
             f"{human(free)} available ({source})")
    if torch.device(device).type == "cuda" and estimate.total <= CUDA_MARGIN * free:
        logger.warning(f"warning: {found}. Estimates on CUDA are not calibrated and may be up to {CUDA_MARGIN:g}× too "
                       f"high, so this goes ahead; if the device runs out of memory, the command stops with a "
                       f"message and what was saved is kept. {fix}")
        return
    raise MemoryLimitError(f"{found}; nothing was started. {fix}")


def largest(estimates: list[Estimate]) -> Optional[Estimate]:
    """The estimate with the most bytes (the one a sequence of steps must fit), or None."""
    return max(estimates, key=lambda e: e.total, default=None)


def check_training(cfg: RunConfig, device: torch.device | str, world_size: int = 1) -> None:
    """Refuse a training run whose step (and, for synthetic tasks, fixed validation set of
    (x, y) int64 batches) cannot fit on ``device``."""
    t = cfg.train
    kept = ()
    if cfg.data.source == "synthetic":
        kept = (("validation set", 16.0 * t.eval_batches * t.batch_size * world_size * t.seq_len),)
    estimate = training_estimate(cfg.model, t.batch_size, t.seq_len, t.random_positions is not None, kept)
    check_fits(estimate, device, "Lower train.batch_size (raising train.grad_accum keeps the tokens per step) "
                                 "or train.seq_len.")
