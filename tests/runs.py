"""Runs in tests: :func:`same`, runs compared to the last bit; and the command-line tests' shared
run: the settings of a quick ``lossscale run`` (60 steps, some
overflows, growth and backoff), made once per test process by the ``earlier_run`` fixture of
``tests/lossscale_tests/app_tests/conftest.py`` and copied where a test needs a finished run's folder."""

#: A quick run's options (after ``run``).
FAST = ["--steps", "60", "--quiet", "--manager-arg", "incr_every_n_steps=10"]


def same(a: object, b: object) -> bool:
    """Rows (or any values) equal to the last bit, NaN equal to NaN: their reprs (a float's repr is
    its shortest exact text, and tells -0.0 from 0.0)."""
    return repr(a) == repr(b)
