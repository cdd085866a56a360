"""Training on the simulated device: the step loop (``simulate``), its workloads (built in,
torch, JAX and your own), the frameworks' overflow detectors, the optimizers, and the FP8
scaling recipes.

The middle layer of ``lossscale``: it uses ``lossscale.policy`` and ``sim``, never
``lossscale.app``.
"""
