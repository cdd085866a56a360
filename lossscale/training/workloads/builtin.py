"""The built-in workloads: ``mlp`` (a perceptron on the digits) and ``trace`` (synthetic
gradients, cheap enough for sweeps)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sim import Device
from sim import binary32 as b32

from ..optimizers import Adam, Momentum
from ..phases import begin_phase
from .base import COUNT, FLAG, MOMENTUM, POSITIVE, Argument, Draws, argument, check_workload_args, digits

__all__: list[str] = []  # Mlp and Trace are public as lossscale.training.workloads'

F32, H = np.float32, np.float16

#: The digits' training split (the first 1500 of a fixed permutation of the 1797 images; the
#: rest is the test set): a batch draws at most this many, without replacement.
DIGITS_TRAIN = 1500


def check_fields(workload: Any, label: str) -> None:
    """A built-in workload's declared arguments checked, as constructed (see ``argument``)."""
    check_workload_args(type(workload), vars(workload), label)


def _softmax32(z: np.ndarray) -> np.ndarray:
    e = b32.apply("exp", z - z.max(axis=1, keepdims=True))
    return e / b32.sum(e, axis=1, keepdims=True)


def _forward32(x: np.ndarray, params: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The perceptron in binary32 (see :meth:`Mlp.grads32`): z1, h = relu(z1), softmax."""
    w1, b1, w2, b2 = params
    z1 = b32.matmul(x, w1, init=b1)
    h = np.maximum(z1, F32(0))
    return z1, h, _softmax32(b32.matmul(h, w2, init=b2))


@dataclass
class Mlp:
    """A 64-``hidden``-10 perceptron on the digits; ``batch`` images per step.
    ``log_perplexity``: also exp(sum of the batch's losses) in binary16, for logging."""

    seed: int = 0
    hidden: int = argument(32, COUNT)
    batch: int = argument(64, Argument("integer", low=1, high=DIGITS_TRAIN))
    learning_rate: float = argument(0.1, POSITIVE)
    momentum: float = argument(0.9, MOMENTUM)
    log_perplexity: bool = argument(False, FLAG)
    name: str = "mlp"
    has_accuracy: bool = True
    marks_phases: bool = True
    _data: Any = field(default=None, repr=False)

    def __post_init__(self) -> None:
        check_fields(self, "mlp")
        x, y = digits()
        order = np.random.default_rng(1234).permutation(len(y))  # a fixed split, whatever the seed
        x, y = x[order], y[order]
        n = DIGITS_TRAIN
        self.train, self.test = (x[:n], y[:n]), (x[n:], y[n:])
        self._rng = np.random.default_rng(self.seed)

    def init_params(self) -> list[np.ndarray]:
        rng = np.random.default_rng(self.seed)
        he = lambda n_in, n_out: (rng.standard_normal((n_in, n_out)) * np.sqrt(2.0 / n_in)).astype(F32)  # noqa: E731
        return [he(64, self.hidden), np.zeros(self.hidden, F32), he(self.hidden, 10), np.zeros(10, F32)]

    def optimizer(self):
        return Momentum(self.learning_rate, self.momentum)

    def batches(self, steps: int) -> Draws:
        return Draws(len(self.train[1]), self.batch, steps, self.seed + 1)

    def shards(self, batch: np.ndarray, ranks: int) -> list[tuple[np.ndarray, float]]:
        """Each rank's images and its share of the global batch."""
        return [(part, len(part) / len(batch)) for part in np.array_split(batch, ranks)]

    def forward_backward(self, dev: Device, params: list[np.ndarray], scale: float, idx: np.ndarray,
                         share: float = 1.0) -> tuple[float, list[np.ndarray]]:
        """Loss (binary32) and binary16 gradients of S * loss for the images ``idx``,
        a ``share`` of the global batch (the mean is over the global batch)."""
        total = round(len(idx) / share)
        x, y = self.train[0][idx], self.train[1][idx]
        with dev.label("fc1"):
            w1, b1, w2, b2 = (dev.cast(p, H) for p in params)
            x16 = dev.cast(x, H)
            z1 = dev.add(dev.matmul(x16, w1), b1)
        with dev.label("relu"):
            h = dev.relu(z1)
        with dev.label("fc2"):
            logits = dev.cast(dev.add(dev.matmul(h, w2), b2), F32)
        begin_phase(dev, "loss")
        with dev.label("softmax"):
            shifted = dev.sub(logits, logits.max(axis=1, keepdims=True))  # the max itself is exact
            e = dev.exp(shifted)
            p = dev.div(e, dev.sum(e, axis=1)[:, None])
        with dev.label("loss"):
            picked = p[np.arange(len(y)), y]
            losses = dev.log(picked)
            loss = -float(dev.sum(losses, accumulate=F32)) / total
        if self.log_perplexity:
            begin_phase(dev, "log")
            with dev.label("perplexity"):
                dev.exp(dev.neg(dev.sum(dev.cast(losses, H))))
        begin_phase(dev, "scale")
        with dev.label("loss"):
            coef = dev.div(F32(scale), F32(total))
        begin_phase(dev, "backward")
        with dev.label("softmax"):
            onehot = np.zeros_like(p)
            onehot[np.arange(len(y)), y] = 1
            dlogits = dev.cast(dev.mul(dev.sub(p, onehot), coef), H)  # where a too-high scale overflows
        with dev.label("fc2"):
            dw2 = dev.matmul(np.ascontiguousarray(h.T), dlogits)
            db2 = dev.sum(dlogits, axis=0, accumulate=F32, out_dtype=H)
            dh = dev.matmul(dlogits, np.ascontiguousarray(w2.T))
        dz1 = np.where(z1 > 0, dh, H(0))  # ReLU's gradient selects, it does not multiply
        with dev.label("fc1"):
            dw1 = dev.matmul(np.ascontiguousarray(x16.T), dz1)
            db1 = dev.sum(dz1, axis=0, accumulate=F32, out_dtype=H)
        return loss, [dw1, db1, dw2, db2]

    def grads32(self, params: list[np.ndarray], idx: np.ndarray, share: float = 1.0) -> tuple[float, list[np.ndarray]]:
        """The same loss and (unscaled) gradients in binary32, every bit a function of the
        operands (:mod:`sim.binary32`): matmuls in order along k from the bias (or from +0),
        sums in the pairwise tree, exp and log correctly rounded, the rest IEEE operations."""
        total = round(len(idx) / share)
        x, y = self.train[0][idx], self.train[1][idx]
        w1, b1, w2, b2 = params
        z1, h, p = _forward32(x, params)
        picked = p[np.arange(len(y)), y]
        loss = -float(b32.sum(b32.apply("log", picked))) / total  # an underflowed probability: Inf, as it is
        d = p.copy()
        d[np.arange(len(y)), y] -= 1
        d /= F32(total)
        dh = b32.matmul(d, w2.T) * (z1 > 0)
        return loss, [b32.matmul(x.T, dh), b32.sum(dh, axis=0), b32.matmul(h.T, d), b32.sum(d, axis=0)]

    def evaluate(self, params: list[np.ndarray]) -> dict[str, float]:
        """Test loss and accuracy of binary32 weights, computed in binary32 as :meth:`grads32`."""
        x, y = self.test
        with np.errstate(all="ignore"):
            p = _forward32(x, params)[2]
            picked = np.maximum(p[np.arange(len(y)), y], np.finfo(F32).tiny)
            loss = -float(b32.mean(b32.apply("log", picked)))
        return {"loss": loss, "accuracy": float((p.argmax(axis=1) == y).mean())}


@dataclass
class Trace:
    """Synthetic gradients ``m_t * spread * (w - w*)`` with a drifting, spiking m_t."""

    seed: int = 0
    size: int = argument(4096, COUNT)
    batch: int = argument(1, COUNT)
    learning_rate: float = argument(0.01, POSITIVE)
    drift: float = argument(0.15, Argument("number", low=0))
    spike_rate: float = argument(0.03, Argument("number", low=0, high=1))
    spread: float = argument(3.0, Argument("number", low=0))
    name: str = "trace"
    has_accuracy: bool = False
    marks_phases: bool = True

    def __post_init__(self) -> None:
        check_fields(self, "trace")
        rng = np.random.default_rng(self.seed)
        self.target = rng.standard_normal(self.size).astype(F32)
        self.pattern = b32.apply("exp2", rng.standard_normal(self.size) * self.spread - 4)  # correctly rounded

    def init_params(self) -> list[np.ndarray]:
        return [np.zeros(self.size, F32)]

    def optimizer(self):
        """Adam: its steps do not grow with the gradient's magnitude, so spikes that get
        through do not blow the model up; lost (underflowed) elements and skipped steps
        still slow it down."""
        return Adam(self.learning_rate)

    def batches(self, steps: int) -> np.ndarray:
        """Per step, the gradient's overall magnitude m_t as log2 (the 'batch')."""
        rng = np.random.default_rng(self.seed + 1)
        walk = np.cumsum(rng.standard_normal(steps) * self.drift) - 2
        spikes = (rng.random(steps) < self.spike_rate) * rng.uniform(6, 12, steps)
        return (walk + spikes)[:, None]

    def shards(self, batch: np.ndarray, ranks: int) -> list[tuple[np.ndarray, float]]:
        """Every rank sees the same magnitude and holds 1/ranks of the gradient."""
        return [(batch, 1 / ranks)] * ranks

    def forward_backward(self, dev: Device, params, scale: float, log2m: np.ndarray, share: float = 1.0):
        g32 = self._grad(params, log2m, share)
        begin_phase(dev, "scale")
        scaled = dev.mul(g32, F32(scale))
        begin_phase(dev, "backward")
        return self._loss(params), [dev.cast(scaled, H)]

    def _grad(self, params, log2m, share: float = 1.0) -> np.ndarray:
        m = F32(float(b32.apply("exp2", np.float64(log2m[0]))) * share)  # 2**x correctly rounded, not libm's
        return (m * self.pattern * (params[0] - self.target)).astype(F32)

    def _loss(self, params) -> float:
        """Half the mean squared distance to the target, in binary32 (the tree mean)."""
        d = params[0] - self.target
        return float(F32(0.5) * b32.mean(d * d))

    def grads32(self, params, log2m, share: float = 1.0):
        return self._loss(params), [self._grad(params, log2m, share)]

    def evaluate(self, params) -> dict[str, float]:
        return {"loss": self._loss(params), "accuracy": float("nan")}

