"""Where a run computes: the one reading of ``model.device`` (and of a learner rank's device).

Every model a run builds (policy, reference, teacher, critic) is placed by
``reasonrl.policy.factory`` on the device :func:`resolve_device` returns, and every batch reaches
a model through that model's ``HFPolicy`` (which moves its inputs there): no other code picks a
device. Batches themselves live on the CPU between stages, as verl's ``DataProto`` does between
workers, so stages that are not models (rewards, selectors, advantages) never see a GPU tensor.
"""

from __future__ import annotations

import os
import re

from reasonrl.params import ConfigError

DEVICE_SPEC = re.compile(r"^(auto|cpu|cuda|cuda:\d+)$")
DEVICE_CHOICES = "auto, cpu, cuda, cuda:N"


def local_rank() -> int:
    """This process's rank on its machine (torchrun's ``LOCAL_RANK``; 0 outside a launcher)."""
    return int(os.environ.get("LOCAL_RANK", "0") or 0)


def check_device_spec(spec: str, where: str = "model.device") -> None:
    """Refuse a device this machine does not have, naming the key (the CLI exits 2)."""
    if not isinstance(spec, str) or not DEVICE_SPEC.match(spec):
        raise ConfigError(f"{where} must be one of {DEVICE_CHOICES}; got {spec!r}")
    if spec.startswith("cuda"):
        # torch only now: reading a recipe's schema (``import reasonrl``) stays free of torch.
        import torch

        if not torch.cuda.is_available():
            raise ConfigError(f"{where} is {spec!r} but this machine has no CUDA device (torch {torch.__version__}, "
                              f"torch.cuda.is_available() is False); use 'cpu' or 'auto'")
        index = int(spec.split(":")[1]) if ":" in spec else local_rank()
        if index >= torch.cuda.device_count():
            raise ConfigError(f"{where} is {spec!r} but this machine has {torch.cuda.device_count()} CUDA device(s)"
                              + ("" if ":" in spec else f" and this is local rank {index}"))


def resolve_device(spec: str = "auto"):
    """``auto``: this rank's GPU when CUDA is available, else the CPU; ``cuda``: this rank's GPU
    (``cuda:LOCAL_RANK``); ``cuda:N``: that GPU; ``cpu``. Checked by :func:`check_device_spec`."""
    import torch  # see check_device_spec

    check_device_spec(spec)
    if spec == "cpu" or (spec == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if spec in ("auto", "cuda"):
        return torch.device("cuda", local_rank())
    return torch.device(spec)
