"""The application: the ``lossscale`` command line, run folders (``files``), figures
(``plots``) and parameter sweeps (``sweep``).

The top layer of ``lossscale``: it uses ``lossscale.training`` and ``lossscale.policy``.
"""

#: The image formats the plots are written in (``--format``): here, so that the command line
#: names them without importing matplotlib.
IMAGE_FORMATS = ("png", "svg", "pdf")
