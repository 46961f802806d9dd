"""Where and how a run executes: device, precision, and the data-parallel group.

Under ``torchrun`` (RANK/WORLD_SIZE/LOCAL_RANK set) the process group is NCCL on CUDA
and gloo on CPU; multi-node works the same way with torchrun's rendezvous arguments.
Precision ``auto`` is float32 on CPU (bf16 matmuls are hundreds of times slower on
typical CPUs) and bf16 autocast on CUDA devices that support it (else fp16 with a
gradient scaler).
"""

from __future__ import annotations

import contextlib
import math
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import torch
import torch.distributed as dist

from ropelab.common.devices import check_device_name, machine_busy
from ropelab.common.errors import ConfigError

# Dense bf16 peak FLOP/s of common accelerators, for MFU (vendor datasheets).
PEAK_FLOPS = {"A100": 312e12, "H100": 989e12, "H200": 989e12, "A10G": 125e12, "L4": 121e12,
              "RTX 4090": 165e12, "RTX 3090": 71e12, "V100": 125e12}


@dataclass
class Runtime:
    device: torch.device
    dtype: torch.dtype  # autocast dtype; float32 means no autocast
    rank: int = 0
    world_size: int = 1
    peak_flops: Optional[float] = None  # per device, for MFU
    peak_source: str = "unknown"  # "measured matmul", "datasheet (…)" or the env variable

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def autocast(self):
        if self.dtype == torch.float32:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.dtype)

    def synchronize(self) -> None:
        """Wait for this device's queued work (timing on a GPU); nothing on the CPU."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def barrier(self) -> None:
        if self.world_size > 1:
            dist.barrier()

    def mean_across_ranks(self, value: torch.Tensor) -> float:
        return float(self.mean_across_ranks_tensor(value))

    def mean_across_ranks_tensor(self, value: torch.Tensor) -> torch.Tensor:
        """The mean of ``value`` over the ranks, left on the device (nothing read back)."""
        if self.world_size > 1:
            value = value.clone()
            dist.all_reduce(value, op=dist.ReduceOp.SUM)
            value /= self.world_size
        return value

    def any_rank(self, flag: bool) -> bool:
        if self.world_size == 1:
            return flag
        t = torch.tensor([1.0 if flag else 0.0], device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return bool(t.item())

    def mfu(self, achieved_flops: float) -> Optional[float]:
        """Model FLOPs utilisation over all ranks, when the device's peak is known."""
        if not self.peak_flops:
            return None
        return achieved_flops / (self.peak_flops * self.world_size)

    def peak_memory_gib(self) -> Optional[float]:
        """The allocator's high-water mark on this rank's GPU since the last call (GiB), or
        None off CUDA. Each call resets it, so a log line reports its own window's peak."""
        if self.device.type != "cuda":
            return None
        peak = torch.cuda.max_memory_allocated(self.device) / 2**30
        torch.cuda.reset_peak_memory_stats(self.device)
        return peak

    def close(self) -> None:
        if self.world_size > 1 and dist.is_initialized():
            dist.destroy_process_group()


def resolve_device(choice: str, what: str = "train.device", local_rank: Optional[int] = None) -> torch.device:
    """The torch device ``choice`` names (common/devices.py), or a ConfigError saying what
    is visible. ``local_rank``: this process's rank on its node under torchrun, whose GPU
    ``cuda`` and ``auto`` then mean."""
    check_device_name(choice, what)
    if choice == "auto":
        choice = "cuda" if torch.cuda.is_available() else "cpu"
    if choice.startswith("cuda"):
        return _cuda_device(choice, what, local_rank)
    if choice == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(f"{what}=mps but MPS is not available on this machine; use {what}=auto or cpu")
    return torch.device(choice)


def _cuda_device(choice: str, what: str, local_rank: Optional[int]) -> torch.device:
    if not torch.cuda.is_available():
        build = "this torch build has no CUDA" if torch.version.cuda is None else "none is visible"
        raise ConfigError(f"{what}={choice} needs a CUDA GPU, but {build}; use {what}=auto or cpu")
    count = torch.cuda.device_count()
    if choice == "cuda":
        index = local_rank or 0
    elif local_rank is not None:
        raise ConfigError(f"{what}={choice} names one GPU, but torchrun gives each process its own "
                          f"(cuda:LOCAL_RANK); use {what}=cuda, and CUDA_VISIBLE_DEVICES to choose the GPUs")
    else:
        index = int(choice.split(":")[1])
    if index >= count:
        raise ConfigError(f"{what}={choice}: only {count} CUDA device{'s' if count > 1 else ''} visible "
                          f"(cuda:0{f' … cuda:{count - 1}' if count > 1 else ''}); choose one of them or {what}=auto")
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def _dtype(choice: str, device: torch.device) -> torch.dtype:
    if choice == "auto":
        if device.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.float32
    if choice == "float16" and device.type == "cpu":
        raise ConfigError("train.dtype=float16 is not supported on CPU; use float32 (or bfloat16)")
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[choice]


def synchronize(device: torch.device) -> None:
    """Wait for queued GPU work, so a timer measures it; nothing to wait for on a CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_calls(fn: Callable[[], object], repeats: int, warmup: int, device: torch.device) -> list[float]:
    """Seconds of each of ``repeats`` calls of ``fn`` after ``warmup`` untimed ones."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        fn()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return times


# A GPU reaches its matmul limit only on large matrices: an H100's bf16 rate was ~430
# TFLOP/s at 2048² but ~780 at 8192² (measured 2026-11-22). A CPU is there by 1024².
GPU_PEAK_SIZES = (2048, 4096, 8192)


def measure_matmul_peak(device: torch.device, dtype: torch.dtype, sizes: tuple[int, ...] = (1024,),
                        repeats: int = 5) -> dict:
    """The machine's own matmul limit: the best rate (FLOP/s) seen over square ``sizes``.

    The fastest repeat, not the median: a peak is what the hardware can do, and a momentary
    slowdown (another process) must not lower it and so inflate MFU.
    """
    best, median = {}, {}
    for n in sizes:
        a = torch.randn(n, n, device=device, dtype=dtype)
        b = torch.randn(n, n, device=device, dtype=dtype)
        times = time_calls(lambda: a @ b, repeats, 3, device)
        best[n], median[n] = 2 * n**3 / min(times), 2 * n**3 / statistics.median(times)
    size = max(best, key=best.get)
    return {"flops": best[size], "size": size, "dtype": str(dtype).replace("torch.", ""),
            "best_by_size": {str(n): r for n, r in best.items()},
            "median_by_size": {str(n): r for n, r in median.items()}}


def cache_dir() -> Path:
    """Where the machine's timings are kept: the shapes' probes (training/step_timing.py) and the
    best matmul rates seen."""
    return Path(os.environ.get("ROPELAB_PROBE_CACHE") or Path.home() / ".cache" / "ropelab" / "probes")


def peak_flops_from_env(text: str) -> float:
    """ROPELAB_PEAK_FLOPS: a device's peak FLOP/s for MFU, a positive finite number (e.g. 989e12)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise ConfigError(f"the environment variable ROPELAB_PEAK_FLOPS={text!r} is not a positive number of "
                          "FLOP/s (e.g. 989e12 for an H100's bf16 peak); fix it or unset it to measure the peak")
    return value


def _peak_flops(device: torch.device, dtype: torch.dtype) -> tuple[Optional[float], str]:
    """(peak FLOP/s per device for MFU, where it came from)."""
    if os.environ.get("ROPELAB_PEAK_FLOPS"):
        return peak_flops_from_env(os.environ["ROPELAB_PEAK_FLOPS"]), "ROPELAB_PEAK_FLOPS"
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        known = next((flops for key, flops in PEAK_FLOPS.items() if key in name), None)
        if known is not None and dtype != torch.float32:
            return known, f"datasheet ({name})"
    if device.type == "cpu" and dtype != torch.float32:
        return None, f"not measured ({dtype} matmuls on a CPU are too slow to time at startup)"
    if device.type in ("cpu", "cuda"):  # no datasheet figure: measure in this run (~0.1 s on a CPU)
        sizes = GPU_PEAK_SIZES if device.type == "cuda" else (1024,)
        peak = float(measure_matmul_peak(device, dtype, sizes)["flops"])
        busy = machine_busy(device.type)
        return peak, "measured matmul at this run's start" + (
            f", while other work shared the CPUs ({busy}): its MFU may read high" if busy else "")
    return None, "unknown"


def _env_int(name: str, default: int) -> int:
    """A torchrun variable (RANK, WORLD_SIZE, LOCAL_RANK): a non-negative integer."""
    text = os.environ.get(name)
    if text is None:
        return default
    if not text.strip().isdigit():
        raise ConfigError(f"the environment variable {name}={text!r} is not a non-negative integer; torchrun "
                          f"sets it for each process: unset it to train in one process")
    return int(text)


def setup_runtime(train_cfg) -> Runtime:
    """Join the torchrun process group if there is one, and pick device and precision."""
    rank, world = _env_int("RANK", 0), _env_int("WORLD_SIZE", 1)
    local_rank = _env_int("LOCAL_RANK", 0) if world > 1 else None
    device = resolve_device(train_cfg.device, "train.device", local_rank)
    if world > 1 and not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    dtype = _dtype(train_cfg.dtype, device)
    peak, source = _peak_flops(device, dtype)
    return Runtime(device=device, dtype=dtype, rank=rank, world_size=world, peak_flops=peak,
                   peak_source=source)
