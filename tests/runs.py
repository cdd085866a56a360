"""The command-line tests' shared run: the settings of a quick ``lossscale run`` (60 steps, some
overflows, growth and backoff), made once per test process by the ``earlier_run`` fixture of
``tests/lossscale_tests/app_tests/conftest.py`` and copied where a test needs a finished run's folder."""

#: A quick run's options (after ``run``).
FAST = ["--steps", "60", "--quiet", "--manager-arg", "incr_every_n_steps=10"]
