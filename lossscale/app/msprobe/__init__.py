"""msprobe dumps in and out: what Ascend's precision debugger recorded of a script, read back and
re-executed on a simulated device, and a simulated run dumped by msprobe itself (optional extras
``torch``; ``msprobe`` to write a dump, not to read one).

msprobe (PyPI ``mindstudio-probe``; ``msprobe.pytorch.PrecisionDebugger``) writes one folder per step
and rank (``step0/rank0``, or ``step0/proc<pid>`` where there is no rank) holding ``dump.json``
(``task``, ``level``, ``framework``, ``dump_data_dir`` and ``data``: per call, an API named
``<Kind>.<api>.<count>.<forward|backward>`` (levels L1 and mix) or a module named
``Module.<path>.<Class>.<forward|backward|parameters_grad>.<count>`` (L0 and mix), its
``input_args``, ``input_kwargs``, ``output`` and, for a module, ``parameters`` for a forward call,
``input`` and ``output`` for a backward one, each tensor as its ``dtype``, ``shape``, ``Max``,
``Min``, ``Mean``, ``Norm``, with the ``md5`` summary its CRC, with the ``tensor`` task
``data_name``, its file under ``dump_tensor_data/``), ``stack.json`` (the call stacks: ``{id:
[[names], [frames, innermost first]]}``) and ``construct.json`` (each call's parent module).

- :func:`read_dump` (``dump``) reads every call of every step and rank, with its module path and
  the user's source line;
- :func:`replay` (``replay``) re-executes each call whose tensors the dump holds under
  :class:`sim.torch.DeviceMode`, one at a time from the dumped tensors, and compares each output
  with the dumped one: bit for bit, in units in the last place, and by msprobe's own metrics as
  its compare computes them (``metrics``), with the register events the call raised;
- :func:`verdict` (``verdict``) names each step's and rank's first producer of a non-finite value
  and the products and modes that reproduce it;
- :func:`collected_on_host` (``host``) lets msprobe's debugger dump a run under DeviceMode, its
  own statistics and copies kept off the device: a simulated run as an msprobe dump, for
  ``msprobe compare`` against a card's;
- :func:`statistics` (``statistics``) sets a statistics-only dump against the device's dump of the
  same script: Max, Min, Mean and Norm differences as msprobe's statistics compare gives them;
- ``command``: ``lossscale msprobe DUMP``.

Not re-executed: a module's backward and parameter gradients (its APIs' backward entries are the
autograd nodes), modules whose settings the dump does not hold (anything beyond :data:`MODULES`),
and every call of a statistics or md5 dump (no tensors: their statistics serve the verdict, and
:func:`statistics` sets them against a simulated run's).
"""

__all__: list[str] = []  # public as lossscale.msprobe's
