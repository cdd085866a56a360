"""A workload whose every number is chosen by the test: its gradients, its losses, and in which
phase of which step a device operation overflows. The trajectory's columns can then be worked
out by hand (``test_simulate.py`` and ``test_who_sees.py`` in tests/lossscale_tests/training_tests)."""

from __future__ import annotations

import numpy as np

from lossscale import SGD
from lossscale.training.phases import begin_phase

F32, H = np.float32, np.float16
TINY = 2.0**-40  # times any scale used here (at most 2**10) is below half binary16's 2**-24: flushed to 0
HUGE = 2.0**12  # times any scale used here (at least 2**6) is beyond binary16's 65504: overflows
#: The unscaled gradient of each step (a step not listed has BASE), and the phase in which one
#: extra device operation (60000 * 2 in binary16) overflows.
BASE = (0.5, -0.25, TINY, 0.0)
GRADS = {3: (0.5, -0.25, TINY, HUGE), 4: (0.5, TINY, TINY, 0.0)}
EVENTS = {1: "forward", 2: "log", 5: "loss"}  # and step 3's gradient overflows in "backward"
INIT = (1.0, 1.0, 0.0, 0.0)  # 0 where a TINY step lands: 0 - 2**-41 is exact in binary32
LR = 0.5


def grad(t: int) -> np.ndarray:
    return np.array(GRADS.get(t, BASE), F32)


class Scripted:
    """One parameter w of 4 elements; step t's loss is w . g_t and its gradient g_t (whatever w)."""

    name = "scripted"
    has_accuracy = False
    marks_phases = True

    def init_params(self):
        return [np.array(INIT, F32)]

    def optimizer(self):
        return SGD(LR)

    def batches(self, steps):
        return list(range(steps))

    def shards(self, t, ranks):
        return [(t, 1.0 / ranks)] * ranks

    def forward_backward(self, dev, params, scale, t, share=1.0):
        for phase in ("forward", "loss", "log", "scale"):
            if phase != "forward":
                begin_phase(dev, phase)
            if EVENTS.get(t) == phase:
                dev.mul(H(60000), H(2))
        begin_phase(dev, "backward")
        g16 = dev.cast(dev.mul(grad(t), F32(scale)), H)  # the scaled gradient, rounded to binary16
        return float(np.dot(params[0].astype(np.float64), grad(t))), [g16]

    def grads32(self, params, t, share=1.0):
        return float(np.dot(params[0].astype(np.float64), grad(t))), [grad(t)]

    def evaluate(self, params):
        return {"loss": float(np.dot(params[0].astype(np.float64), BASE)), "accuracy": float("nan")}


#: The steps each detector skips, by the device's overflow mode, read off its documented window
#: (lossscale.training.detectors, docs/semantics.md): tf-npu reads (then clears) everything since
#: its last read, so it sees the forward, log, loss and backward events; torch-npu, mindspore,
#: paddle-npu and deepspeed-npu clear at the scale phase in saturation mode and see the backward only; all-finite
#: and megatron-npu (read, cleared if set, never cleared elsewhere) read like tf-npu in saturation
#: mode; in INF/NaN mode all but tf-npu check the gradients (only
#: step 3's are Inf); isfinite and the norm checks (deepspeed-sum, fairseq-norm, megatron-norm)
#: never see saturated gradients: 65504's square and sums stay finite in binary32.
SKIPS = {
    "saturation": {"tf-npu": {1, 2, 3, 5}, "torch-npu": {3}, "mindspore": {3}, "mindspore-all-finite": {1, 2, 3, 5},
                   "paddle-npu": {3}, "deepspeed-npu": {3}, "megatron-npu": {1, 2, 3, 5}, "isfinite": set(),
                   "deepspeed-sum": set(),
                   "fairseq-norm": set(), "megatron-norm": set()},
    "inf_nan": {"tf-npu": {1, 2, 3, 5}, "torch-npu": {3}, "mindspore": {3}, "mindspore-all-finite": {3},
                "paddle-npu": {3}, "deepspeed-npu": {3}, "megatron-npu": {3}, "isfinite": {3}, "deepspeed-sum": {3},
                "fairseq-norm": {3},
                "megatron-norm": {3}},
}
#: Where the register is when the check finds it: cleared after each read ("step": this step's
#: events), at the scale phase ("backward": the backward's events), or never ("run": every event so far).
_GRADIENT_CHECKS = dict.fromkeys(("isfinite", "deepspeed-sum", "fairseq-norm", "megatron-norm"), "run")
REGISTER_WINDOW = {
    "saturation": {"tf-npu": "step", "torch-npu": "backward", "mindspore": "backward", "paddle-npu": "backward",
                   "deepspeed-npu": "backward",
                   "mindspore-all-finite": "step", "megatron-npu": "step", **_GRADIENT_CHECKS},
    "inf_nan": {"tf-npu": "step", "torch-npu": "run", "mindspore": "run", "mindspore-all-finite": "run",
                "paddle-npu": "run", "deepspeed-npu": "run", "megatron-npu": "run", **_GRADIENT_CHECKS},
}
#: The phase of each step's overflow, and whether that phase feeds the update (all but log do).
PHASE_OF = {**EVENTS, 3: "backward"}
FEEDS = {1: True, 2: False, 3: True, 5: True}
