"""The device names every entry point accepts (one rule for configs and command lines), and
whether the CPUs this process may use are busy with other work.

``auto`` (a CUDA GPU when one is visible, else the CPU), ``cpu``, ``cuda`` (the first GPU;
under torchrun each process's own), ``cuda:N`` or ``mps``. Only the spelling is checked
here, when a config or flag is read; whether the device exists is checked when it is
used (training/runtime.py: ``resolve_device``), with a message saying what is visible.
"""

from __future__ import annotations

import os
import re

from ropelab.common.errors import ConfigError

DEVICE_NAMES = "auto, cpu, cuda, cuda:N (N = 0, 1, …) or mps"
_DEVICE = re.compile(r"^(auto|cpu|mps|cuda(:\d+)?)$")


def check_device_name(name: object, key: str) -> str:
    """``name`` if it is a device name, else a ConfigError naming ``key``."""
    if not isinstance(name, str) or not _DEVICE.match(name):
        raise ConfigError(f"{key}: {name!r} is not a device; use {DEVICE_NAMES}")
    return name


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask where the OS has one: a Slurm job's
    or container's share, not the machine's count)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def machine_busy(device_type: str = "cpu") -> str:
    """An empty string on a quiet machine (or for a timing on a GPU); else what says it was not:
    the 1-minute load average, less this process's own thread, against the CPUs this process may
    use, when that other load would take half of them. Timings taken then run long (and a
    compile's payback is judged on them), so the record says so. On a host whose load average
    counts other tenants (some containers) this can say busy when this machine is not; it never
    changes a number. Every timing that may run slow on a shared machine asks it: the grid's
    probes (training/step_timing.py), the matmul peak behind MFU (training/runtime.py) and the
    benchmark (bench/run.py)."""
    if device_type != "cpu":
        return ""
    try:
        load = os.getloadavg()[0]
        cpus = usable_cpus()
    except OSError:
        return ""
    return f"load average {load:.1f} on {cpus} CPU{'s' if cpus != 1 else ''}" if load - 1 >= cpus / 2 else ""
