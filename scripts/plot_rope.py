"""Pictures that explain RoPE: ``ropelab plot-rope [--out docs/rope]``.

1. ``rope_cos_sin.png`` — cos and sin of the rotation angles m·θ_i over position m ×
   dimension (half-split layout): fast pairs on the left, slow pairs on the right.
2. ``rope_decay.png`` — RoFormer's long-range decay (Su et al. 2021, §3.4.3): with
   S_j = Σ_{k<j} e^{i(m−n)θ_k}, the attention score is bounded by
   max|h_{j+1}−h_j| · Σ_j |S_j|; the plot shows the relative bound (1/(d/2)) Σ_j |S_j|
   against the relative distance m−n, for a few bases θ.
3. ``rope_attention.png`` — scores q_m·k_n for one fixed query/key vector at every
   position pair, without and with RoPE: without, every pair scores alike; with RoPE the
   score depends only on m−n (constant along diagonals).
All computed with the project's own RoPE (model/positional/rope.py), not a re-implementation.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

from ropelab.model.config import ModelConfig, PosConfig, RopeConfig  # noqa: E402
from ropelab.model.positional.rope import RoPE  # noqa: E402
from ropelab.model.positional.rope_scaling import base_inv_freq  # noqa: E402
from ropelab.common.cli import check_output_dir, entry_point, moved  # noqa: E402
from ropelab.common.logs import get_logger  # noqa: E402

logger = get_logger(__name__)


def rope_for(head_dim: int, theta: float = 10000.0) -> RoPE:
    return RoPE(ModelConfig(d_model=head_dim, n_heads=1, pos=PosConfig(rope=RopeConfig(theta=theta))))


def plot_cos_sin(path: Path, head_dim: int = 64, positions: int = 128) -> None:
    cos, sin = rope_for(head_dim).cos_sin(torch.arange(positions))
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for ax, table, name in zip(axes, (cos, sin), ("cos(m·θ_i)", "sin(m·θ_i)")):
        im = ax.imshow(table.numpy(), aspect="auto", cmap="RdBu_r", vmin=-1, vmax=1, origin="lower")
        ax.set_title(f"{name}, head dim {head_dim}, θ = 10000", fontsize=10)
        ax.set_xlabel("dimension (half-split layout: pair i at i and i + d/2)")
    axes[0].set_ylabel("position m")
    fig.colorbar(im, ax=axes, shrink=0.8)
    fig.savefig(path, dpi=130, bbox_inches="tight")
    plt.close(fig)


def relative_bound(distance: torch.Tensor, head_dim: int, theta: float) -> torch.Tensor:
    """(1/(d/2)) Σ_{j=1}^{d/2} |S_j| with S_j = Σ_{k<j} exp(i·distance·θ_k)."""
    inv_freq = base_inv_freq(head_dim, theta)  # float64
    phases = torch.polar(torch.ones(len(distance), len(inv_freq), dtype=torch.float64),
                         distance.double()[:, None] * inv_freq[None, :])
    partial = phases.cumsum(dim=1)  # S_1 … S_{d/2}
    return partial.abs().mean(dim=1)


def plot_decay(path: Path, head_dim: int = 128, max_distance: int = 4096) -> None:
    distance = torch.arange(0, max_distance + 1)
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for theta in (1e3, 1e4, 5e5, 1e6):
        ax.plot(distance, relative_bound(distance, head_dim, theta), linewidth=1, label=f"θ = {theta:g}")
    ax.set_xscale("symlog", linthresh=16, base=2)
    ax.set_xlabel("relative distance m − n")
    ax.set_ylabel("relative upper bound (1/(d/2)) Σ|S_j|")
    ax.set_title(f"RoPE long-range decay (head dim {head_dim})", fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


def plot_attention(path: Path, head_dim: int = 64, positions: int = 64, seed: int = 0) -> None:
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(head_dim, generator=gen)
    k = q + 0.3 * torch.randn(head_dim, generator=gen)
    pos = torch.arange(positions)
    qs, ks = q.expand(1, 1, positions, head_dim), k.expand(1, 1, positions, head_dim)
    plain = (qs @ ks.transpose(-2, -1))[0, 0] / head_dim ** 0.5
    q_rot, k_rot = rope_for(head_dim).rotation(pos)(qs, ks)
    rotated = (q_rot @ k_rot.transpose(-2, -1))[0, 0] / head_dim ** 0.5
    causal = torch.ones(positions, positions, dtype=torch.bool).tril()
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.3))
    vmin, vmax = float(rotated.min()), float(max(rotated.max(), plain.max()))
    for ax, scores, name in zip(axes, (plain, rotated), ("no position encoding", "RoPE (θ = 10000)")):
        im = ax.imshow(scores.masked_fill(~causal, float("nan")).numpy(), cmap="viridis",
                       vmin=vmin, vmax=vmax)
        ax.set_title(f"q_m·k_n/√d, {name}", fontsize=10)
        ax.set_xlabel("key position n")
    axes[0].set_ylabel("query position m")
    fig.colorbar(im, ax=axes, shrink=0.8)
    fig.savefig(path, dpi=130, bbox_inches="tight")
    plt.close(fig)


@entry_point
def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="Plot RoPE explanations.")
    p.add_argument("--out", type=Path, default=Path("docs/rope"), help="directory the PNG files are written to")
    args = p.parse_args(argv)
    check_output_dir(args.out, "--out")
    args.out.mkdir(parents=True, exist_ok=True)
    plot_cos_sin(args.out / "rope_cos_sin.png")
    plot_decay(args.out / "rope_decay.png")
    plot_attention(args.out / "rope_attention.png")
    logger.info(f"wrote rope_cos_sin.png, rope_decay.png, rope_attention.png to {args.out}")
    return 0


if __name__ == "__main__":
    moved("python scripts/plot_rope.py", "ropelab plot-rope")
    sys.exit(main())
