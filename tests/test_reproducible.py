"""The same bits whatever the host's BLAS kernel, CPU capability and thread count.

Each check runs the same work in fresh processes under other settings of the things a host
changes (``OPENBLAS_CORETYPE``, ``OPENBLAS_NUM_THREADS``, ``ATEN_CPU_CAPABILITY``) and compares
the outputs with each other, byte for byte: a `lossscale run` of the built-in ``mlp`` workload
and of ``torch-transformer`` (trajectory.csv, summary.json, events.csv), and DeviceMode's fused
and float32-route functions on every binary16 input in both overflow modes. No expected bits are
written here: a host that computes differently must still give what the others give. `.ci/run`
also runs the whole default run a second time under another kernel and capability, so that a
test pinning host-dependent bits fails there.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

#: Settings a host may differ in. The first is this host's own (none of the variables set).
SETTINGS = (
    {},
    {"OPENBLAS_CORETYPE": "Sandybridge", "OPENBLAS_NUM_THREADS": "1", "ATEN_CPU_CAPABILITY": "default"},
    {"OPENBLAS_CORETYPE": "Haswell", "OPENBLAS_NUM_THREADS": "2", "ATEN_CPU_CAPABILITY": "avx2"},
)
_VARIABLES = ("OPENBLAS_CORETYPE", "OPENBLAS_NUM_THREADS", "ATEN_CPU_CAPABILITY", "OMP_NUM_THREADS")

# Runs in a fresh process: prints a JSON object of digests (and the kernels it ran on).
_SCRIPT = textwrap.dedent("""
    import ctypes, glob, hashlib, json, os, sys
    import numpy as np
    from lossscale.app.cli import main

    out, with_torch = sys.argv[1], sys.argv[2] == "1"
    os.makedirs(out)
    report = {}

    def corename():
        for lib in glob.glob(os.path.join(os.path.dirname(np.__file__) + ".libs", "*openblas*")):
            for name in ("scipy_openblas_get_corename64_", "openblas_get_corename"):
                fn = getattr(ctypes.CDLL(lib), name, None)
                if fn is not None:
                    fn.restype = ctypes.c_char_p
                    return fn().decode()
        return None

    def digest_run(name, *argv):
        folder = os.path.join(out, name)
        assert main(["run", *argv, "--out", folder, "--quiet"]) == 0
        for f in ("trajectory.csv", "summary.json", "events.csv"):
            with open(os.path.join(folder, f), "rb") as fh:
                report[f"{name}/{f}"] = hashlib.sha256(fh.read()).hexdigest()

    report["openblas"] = corename()
    digest_run("mlp", "--steps", "40")
    digest_run("mlp-saturation", "--steps", "40", "--profile", "atlas-training", "--micro-batches", "2")
    if with_torch:
        import torch
        from sim import Device
        from sim.torch import DeviceMode
        report["aten"] = torch.backends.cpu.get_cpu_capability()
        digest_run("torch-transformer", "--workload", "torch-transformer", "--steps", "3")
        F = torch.nn.functional

        def rows(t, n):
            return t.view(-1, min(n, t.numel()))

        x = torch.from_numpy(np.arange(65536, dtype=np.uint16).view(np.float16).copy())
        functions = {
            "exp2": torch.exp2, "expm1": torch.expm1, "log2": torch.log2, "log10": torch.log10,
            "log1p": torch.log1p, "sin": torch.sin, "cos": torch.cos, "tan": torch.tan, "asin": torch.asin,
            "acos": torch.acos, "atan": torch.atan, "sinh": torch.sinh, "cosh": torch.cosh,
            "asinh": torch.asinh, "acosh": torch.acosh, "atanh": torch.atanh, "erfinv": torch.erfinv,
            "erfc": torch.erfc, "i0": torch.special.i0, "lgamma": torch.lgamma,
            "gelu": F.gelu, "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"), "silu": F.silu,
            "mish": F.mish, "softplus": F.softplus, "logsigmoid": F.logsigmoid, "elu": F.elu,
            "selu": F.selu, "pow10": lambda t: t ** 10, "softmax": lambda t: rows(t, 256).softmax(-1),
            "layer_norm": lambda t: F.layer_norm(rows(t, 256).nan_to_num(0.0, 1.0, -1.0), (rows(t, 256).shape[-1],)),
            "prod": lambda t: rows(t, 16).prod(-1), "cumsum": lambda t: rows(t, 256).cumsum(-1),
            "var": lambda t: rows(t, 256).var(-1), "logsumexp": lambda t: rows(t, 256).logsumexp(-1),
        }
        for profile in ("atlas-a2", "atlas-training"):
            for name, fn in functions.items():
                for length in (65536, 7):  # the vector body and a scalar tail
                    dev = Device(profile)
                    with DeviceMode(dev):
                        y = fn(x if length == 65536 else x[40000:40000 + length])
                    report[f"{profile}/{name}/{length}"] = (hashlib.sha256(y.numpy().tobytes()).hexdigest(),
                                                            int(dev.status))
    print(json.dumps(report))
""")


def _torch_present() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


def _run(settings: dict, folder, with_torch: bool) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in _VARIABLES} | settings
    proc = subprocess.run([sys.executable, "-c", _SCRIPT, str(folder), "1" if with_torch else "0"],
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("with_torch", [False, pytest.param(True, id="torch")], ids=["numpy", "torch"])
def test_the_same_bits_under_every_blas_kernel_cpu_capability_and_thread_count(tmp_path, with_torch) -> None:
    if with_torch and not _torch_present():
        pytest.skip("torch is not installed (the torch extra)")
    reports = [_run(s, tmp_path / str(i), with_torch) for i, s in enumerate(SETTINGS)]
    kernels = {k: [r.get(k) for r in reports] for k in ("openblas", "aten")}
    digests = [{k: v for k, v in r.items() if k not in kernels} for r in reports]
    # The settings took effect where the host can tell (a kernel OpenBLAS has, torch's capability).
    if None not in kernels["openblas"]:
        assert kernels["openblas"][1] == "Sandybridge", kernels
    if with_torch:
        assert kernels["aten"][1] == "DEFAULT", kernels
    assert digests[0], "nothing was digested"
    for settings, other in zip(SETTINGS[1:], digests[1:], strict=True):
        differing = sorted(k for k in digests[0] if other.get(k) != digests[0][k])
        assert not differing, f"under {settings} these differ from the host's own settings: {differing}"

