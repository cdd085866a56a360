"""The application: the ``lossscale`` command line, run folders (``files``), figures
(``plots``) and parameter sweeps (``sweep``).

The top layer of ``lossscale``: it uses ``lossscale.training`` and ``lossscale.policy``.
"""
