"""The real workload: an MLP of about ``model_params`` parameters trained on a
seeded synthetic dataset whose samples are named by their index.

Sample ``i`` is a pure function of ``(seed, i)``, so any worker can load any
micro-batch the planner gives it, and a per-sample ledger of indices says
exactly what was trained on. Parameters live in one flat tensor (the module's
parameters are views into it), and so does the SGD momentum: the state a
newcomer copies, a checkpoint stores and the final hash covers is the pair
``(params, momentum)`` in registration order.

On ``cluster.device: cuda`` the state, the gradients and the model live on
the worker's GPU; the model is still initialised and every sample still
generated on the CPU (seeded CPU generators), then moved, so every worker
starts from the same bits and trains on the same data whatever its device.
Checkpoints are written from CPU copies and loaded onto the worker's device.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Optional, Sequence

import torch
from torch import nn

IN_DIM = 32
OUT_DIM = 8
MOMENTUM = 0.9


def hidden_for(params: int) -> int:
    # Linear(IN, H) + Linear(H, OUT): H * (IN + 1 + OUT) + OUT parameters.
    return max(1, (params - OUT_DIM) // (IN_DIM + 1 + OUT_DIM))


def _views(flat: torch.Tensor, params: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Consecutive views of ``flat`` shaped like ``params``, in order."""
    out, off = [], 0
    for p in params:
        k = p.numel()
        out.append(flat[off:off + k].view_as(p))
        off += k
    return out


class Workload:
    """Model, data and optimizer state of one worker."""

    def __init__(self, seed: int, model_params: int, lr: float,
                 device: str | torch.device = "cpu") -> None:
        self.seed = seed
        self.lr = lr
        self.device = torch.device(device)
        torch.manual_seed(seed)
        h = hidden_for(model_params)
        # initialised on the CPU (the seeded generator), then moved, so the
        # same bits on any device; on the CPU .to() is the module itself
        self.model = nn.Sequential(nn.Linear(IN_DIM, h), nn.Tanh(),
                                   nn.Linear(h, OUT_DIM)).to(self.device)
        params = list(self.model.parameters())
        self.n = sum(p.numel() for p in params)
        self.flat = torch.cat([p.detach().reshape(-1) for p in params]).clone()
        self.initial = self.flat.clone()
        # Gradients live in one flat buffer too (each .grad a view into it):
        # backward accumulates in place, with no per-step allocation and no
        # concatenation to hand the gradient to a collective.
        self.grad_buf = torch.zeros(self.n, device=self.device)
        for p, data, grad in zip(params, _views(self.flat, params), _views(self.grad_buf, params)):
            p.data = data
            p.grad = grad
        self.params = params
        self.momentum = torch.zeros(self.n, device=self.device)
        g = torch.Generator().manual_seed(seed * 7919 + 1)
        self.teacher = (torch.randn(IN_DIM, OUT_DIM, generator=g) / IN_DIM ** 0.5).to(self.device)

    # --- data -------------------------------------------------------------------

    def sample(self, i: int) -> torch.Tensor:
        g = torch.Generator().manual_seed((self.seed << 32) ^ (i * 2654435761 % (1 << 31)))
        return torch.randn(IN_DIM, generator=g)

    def batch(self, ids: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.stack([self.sample(i) for i in ids]).to(self.device)
        return x, torch.tanh(x @ self.teacher)

    # --- compute ------------------------------------------------------------

    def zero_grad(self) -> None:
        self.grad_buf.zero_()

    def accumulate(self, ids: Sequence[int]) -> float:
        """Forward/backward one micro-batch (mean loss); gradients add up."""
        x, y = self.batch(ids)
        loss = nn.functional.mse_loss(self.model(x), y)
        loss.backward()
        return float(loss.detach())

    def shard_gradient(self, ids: Sequence[int]) -> tuple[list[torch.Tensor], float]:
        """One micro-batch's gradient on its own (exact mode), one fresh tensor
        per parameter in order, and its loss. Backward writes fresh gradients
        instead of adding into the zeroed flat buffer: no zeroing pass and no
        read of the old values, the cheaper way to get a gradient by itself."""
        params = self.params
        for p in params:
            p.grad = None
        x, y = self.batch(ids)
        loss = nn.functional.mse_loss(self.model(x), y)
        loss.backward()
        grads = [p.grad for p in params]
        for p in params:
            p.grad = None
        return grads, float(loss.detach())

    def flat_grad(self) -> torch.Tensor:
        """A fresh tensor (never reused: an abandoned collective may still write into an old one)."""
        return self.grad_buf.clone()

    def apply(self, grad: torch.Tensor, lr_scale: float = 1.0) -> None:
        """SGD with momentum on the flat state: ``grad`` is the global mean gradient."""
        # Separate multiply and subtract (no fused ``alpha``): one rounding per
        # operation and element, so a slice of the vector gets the same bits
        # as the whole (real.zero updates slices).
        with torch.no_grad():
            self.momentum.mul_(MOMENTUM).add_(grad)
            self.flat.sub_(self.momentum.mul(self.lr * lr_scale))

    # --- state --------------------------------------------------------------

    def reset(self) -> None:
        with torch.no_grad():
            self.flat.copy_(self.initial)
            self.momentum.zero_()

    def initial_state(self) -> torch.Tensor:
        return torch.cat([self.initial, torch.zeros(self.n, device=self.device)])

    def state(self) -> torch.Tensor:
        return torch.cat([self.flat, self.momentum])

    def load_state(self, state: torch.Tensor) -> None:
        with torch.no_grad():
            self.flat.copy_(state[: self.n])
            self.momentum.copy_(state[self.n:])

    def weights_sha256(self) -> str:
        return hashlib.sha256(self.flat.detach().cpu().contiguous().numpy().tobytes()).hexdigest()


def checkpoint_path(run_dir: str | Path, step: int) -> Path:
    return Path(run_dir) / "checkpoints" / f"step-{step:08d}.pt"


def save_checkpoint(run_dir: str | Path, step: int, sample: int, state: torch.Tensor) -> Path:
    path = checkpoint_path(run_dir, step)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    # a CPU copy (on the CPU .cpu() is the tensor itself): a checkpoint
    # loads on any device, and on a machine without the GPU it came from
    torch.save({"step": step, "sample": sample, "state": state.cpu().clone()}, tmp)
    with open(tmp, "rb") as fh:
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    return path


def load_checkpoint(run_dir: str | Path, step: int,
                    map_location: str | torch.device | None = None) -> Optional[dict]:
    """The checkpoint at ``step`` (None if there is none), its tensors on
    ``map_location`` (the worker's device; None: where they were saved)."""
    path = checkpoint_path(run_dir, step)
    if not path.exists():
        return None
    return torch.load(path, weights_only=True, map_location=map_location)
