"""A hand-made mutation check of ``sim`` and ``lossscale``: does the suite notice a wrong line?

Each mutant is one exact snippet of one file replaced by a plausible mistake (a rounding
branch swapped, a tie rule flipped, a boundary off by one, a register slot dropped, a clear
skipped, a comparison flipped, a clamp removed), with the test files that guard that module.
For each mutant the tree (``sim``, ``lossscale``, ``tests``, ``pyproject.toml``) is copied to
a scratch folder, the snippet replaced there, and the guarding tests run with
``pytest -x -q -p no:randomly`` and a timeout. The working files are never touched.

A mutant is *killed* when a test fails (the first failing test is named), *timeout* when the
tests do not finish in time (counted as killed), *survived* when they all pass.

Numba keeps its compiled kernels in ``__pycache__`` beside each source file. The scratch
copies keep the base copy's caches, so only what a mutant touches is compiled again (a mutant
of one compiled file, all of them: ``sim.kernels`` drops the compiled files' caches together).
Before the mutants run, the guarding test files run once unmutated (this warms the caches and
shows they pass; a failing baseline would make every mutant look killed, so the check stops).

Not collected by pytest (its name does not start with ``test_``). Run from the repository::

    python tests/mutation.py                 # every mutant
    python tests/mutation.py --only NAME     # one mutant (repeat --only for more)
    python tests/mutation.py --place policies --list
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COPIED = ("sim", "lossscale", "tests", "pyproject.toml")
PYTEST_ARGS = ("-x", "-q", "-p", "no:randomly", "-p", "no:cacheprovider", "-rfE")


@dataclass(frozen=True)
class Mutant:
    """One mistake: ``original`` (exactly once in ``file``) becomes ``replacement``; ``tests``
    are the test files (or node ids) that guard the module, fastest and sharpest first."""

    name: str
    place: str
    file: str
    original: str
    replacement: str
    tests: tuple[str, ...]


def _t(*names: str) -> tuple[str, ...]:
    """Test files (``test_x``) or tests (``test_x::test_y``) as pytest's paths from the repository
    (a test file's name is unique under ``tests/``, whichever unit's folder holds it)."""
    parts = [n.partition("::") for n in names]
    where = {p.stem: p.relative_to(ROOT).as_posix() for p in (ROOT / "tests").rglob("test_*.py")}
    return tuple(f"{where[file]}{sep}{test}" for file, sep, test in parts)


ARITHMETIC = _t("test_fpu", "test_testfloat", "test_eight_bit", "test_fpu_checks",
                "test_device::test_neg_and_abs_are_sign_bit_operations",
                "test_oracle::test_results_below_the_normal_range")
REGISTER = _t("test_device", "test_observers", "test_who_sees")
DETECTORS = _t("test_detectors", "test_who_sees", "test_norm_detectors", "test_accumulation")
POLICIES = _t("test_policies", "test_policy_models", "test_testing_kit")
CONVERTERS = _t("test_formats", "test_eight_bit", "test_mx")
CLASSIFY = _t("test_simulate", "test_who_sees")
FP8 = _t("test_fp8",)
STACKS = _t("test_device_ops::test_a_stack_sees_the_specials_of_either_operand",
            "test_device_ops::test_a_stack_of_matmuls_is_each_matmul_alone")
SUMS = _t("test_reductions::test_another_accumulator_is_ieee_inside_and_the_mode_applies_to_the_total")
LONG = _t("test_lookup::test_long_binary32_results_read_as_the_routine_rounds",
          "test_device_ops::test_a_long_matmul_rounds_its_sums_as_short_ones")
IM2COL = _t("test_conv::test_im2col_is_the_strided_view_of_the_padded_input", "test_conv")

K, D, DET, FW, AS = "sim/kernels.py", "sim/device/register.py", "lossscale/training/detectors.py", \
    "lossscale/policy/frameworks.py", "lossscale/policy/ascend.py"
F, S, FP, C = "sim/formats.py", "lossscale/training/simulate.py", "lossscale/training/recipes.py", "sim/conv.py"


def _m(name: str, place: str, file: str, original: str, replacement: str, tests: tuple[str, ...]) -> Mutant:
    return Mutant(name, place, file, original, replacement, tests)


MUTANTS: tuple[Mutant, ...] = (
    # -- the register: sim/device/register.py ----------------------------------------------------------------
    _m("d-overflow-in-slot-1", "register", D, "reg[0] |= (status & _OVERFLOW) != 0",
       "reg[1] |= (status & _OVERFLOW) != 0", REGISTER),
    _m("d-invalid-dropped", "register", D, "reg[1] |= (status & _INVALID) != 0", "reg[1] |= 0", REGISTER),
    _m("d-divbyzero-dropped", "register", D, "reg[2] |= (status & _DIVBYZERO) != 0", "reg[2] |= 0", REGISTER),
    _m("d-count-not-counting", "register", D, "reg[3] = min(int(reg[3]) + 1, _INT32_MAX)",
       "reg[3] = max(int(reg[3]), 1)", REGISTER),
    _m("d-clear-keeps-slot-3", "register", D, "self._register[:] = 0", "self._register[:3] = 0", REGISTER),
    _m("d-only-overflow-reaches-register", "register", D, "if status & _EVENTS:", "if status & _OVERFLOW:",
       REGISTER),
    _m("d-status-not-sticky", "register", D, "self._status |= status", "self._status = status", REGISTER),
    _m("d-log-dropped", "register", D, "self._log.append(event)", "pass", REGISTER),
    _m("d-clear-status-no-op", "register", D, "            self._status = 0\n", "            pass\n", REGISTER),
    # -- the detectors: lossscale/training/detectors.py ---------------------------------------------
    _m("det-window-one-phase-late", "detectors", DET, "_ORDER[phase] < _ORDER[self.clears_at]",
       "_ORDER[phase] <= _ORDER[self.clears_at]", DETECTORS),
    _m("det-clears-once-ever", "detectors", DET, "if self._cleared.get(device) != window and",
       "if device not in self._cleared and", DETECTORS),
    _m("det-every-micro-batch", "detectors", DET,
       'current.get("micro_batch") if self.clears_every_micro_batch else None', 'current.get("micro_batch")',
       DETECTORS),
    _m("det-torch-npu-no-clear-on-hit", "detectors", DET, "            if hit:\n                dev.clear",
       "            if False:\n                dev.clear", DETECTORS),
    _m("det-mindspore-threshold", "detectors", DET, "return [int(s[0]) < 1 for", "return [int(s[0]) <= 1 for",
       DETECTORS),
    _m("det-paddle-threshold", "detectors", DET, "return [int(s[0]) <= 1 for", "return [int(s[0]) < 1 for",
       DETECTORS),
    _m("det-tf-no-clear-after-read", "detectors", DET, "    for dev in devices:\n        dev.clear_float_status()",
       "    for dev in devices:\n        pass", DETECTORS),
    _m("det-reduce-flipped", "detectors", DET, "if not self.distributed or len(values) == 1:",
       "if self.distributed or len(values) == 1:", DETECTORS),
    _m("det-reads-register-flipped", "detectors", DET, "return device.overflow is OverflowMode.SATURATION",
       "return device.overflow is not OverflowMode.SATURATION", DETECTORS),
    _m("det-value-check-any", "detectors", DET, "return [all(finite)] * len(finite)",
       "return [any(finite)] * len(finite)", DETECTORS),
    _m("det-fairseq-nan-passes", "detectors", DET, "not (norm == np.inf or norm != norm)", "not (norm == np.inf)",
       DETECTORS),
    _m("det-megatron-threshold", "detectors", DET, "norm > self.skip_threshold", "norm >= self.skip_threshold",
       DETECTORS),
    # -- the policies: lossscale/policy/ ------------------------------------------------------------
    _m("p-torch-interval-off-by-one", "policies", FW, "if tracker + 1 == self.growth_interval:",
       "if tracker == self.growth_interval:", POLICIES),
    _m("p-torch-backoff-keeps-tracker", "policies", FW, "self._times(scale, self.backoff_factor), 0)",
       "self._times(scale, self.backoff_factor), tracker)", POLICIES),
    _m("p-torch-grows-to-inf", "policies", FW, "_Counted(grown if not math.isinf(grown) else scale, 0)",
       "_Counted(grown, 0)", POLICIES),
    _m("p-keras-no-floor", "policies", FW, "_Counted(max(scale / m, f32(1)), 0)", "_Counted(scale / m, 0)",
       POLICIES),
    _m("p-keras-interval-off-by-one", "policies", FW, "if counter + 1 >= self.dynamic_growth_steps:",
       "if counter >= self.dynamic_growth_steps:", POLICIES),
    _m("p-deepspeed-hysteresis-never-spent", "policies", FW, "if self.delayed_shift == 1 or hyst == 1:",
       "if self.delayed_shift == 1 or hyst == 0:", POLICIES),
    _m("p-deepspeed-window-off-by-one", "policies", FW, "stable = it - last - 1", "stable = it - last", POLICIES),
    _m("p-deepspeed-no-min-clamp", "policies", FW, "scale = max(scale / self.scale_factor, float(self.min_scale))",
       "scale = scale / self.scale_factor", POLICIES),
    _m("p-megatron-hysteresis-off-by-one", "policies", FW, "if hyst <= 0:", "if hyst < 0:", POLICIES),
    _m("p-megatron-no-refill", "policies", FW, "f32(self.growth_factor)), 0, self.hysteresis)",
       "f32(self.growth_factor)), 0, hyst)", POLICIES),
    _m("p-megatron-no-min-clamp", "policies", FW,
       "scale = max(scale * f32(self.backoff_factor), f32(self.min_scale))",
       "scale = scale * f32(self.backoff_factor)", POLICIES),
    _m("p-megatron-backoff-factor", "policies", FW, "scale * f32(self.backoff_factor)",
       "scale / f32(self.growth_factor)", POLICIES),
    _m("p-mindspore-window-off-by-one", "policies", FW, "inc = self.scale_window <= cur - last",
       "inc = self.scale_window < cur - last", POLICIES),
    _m("p-jmp-counter-kept-on-overflow", "policies", FW, "((counter + 1) % self.period) * int(finite)",
       "((counter + 1) % self.period)", POLICIES),
    _m("p-apex-no-max-clamp", "policies", FW, "min(float(self.max_loss_scale), scale * 2.0)", "scale * 2.0",
       POLICIES),
    _m("p-fairseq-tolerance-strict", "policies", FW, "since / float(it - last_rescale) >= self.tolerance",
       "since / float(it - last_rescale) > self.tolerance", POLICIES),
    _m("p-ascend-no-floor", "policies", AS, "self.State(max(f32(1), scale * f32(self.decr_ratio)))",
       "self.State(scale * f32(self.decr_ratio))", POLICIES),
    _m("p-ascend-bad-step-keeps-good", "policies", AS, "return self.State(scale, 0, bad + 1)",
       "return self.State(scale, good, bad + 1)", POLICIES),
    _m("p-ascend-growth-guard-inclusive", "policies", AS, "if scale < f32(3.4e38 / self.incr_ratio)",
       "if scale <= f32(3.4e38 / self.incr_ratio)", POLICIES),
    _m("p-ascend-decr-every-off-by-one", "policies", AS, "if bad + 1 >= self.decr_every_n_nan_or_inf:",
       "if bad >= self.decr_every_n_nan_or_inf:", POLICIES),
    # -- the converters: sim/formats.py -------------------------------------------------------------
    _m("f-all-ones-nan-codes", "converters", F, '"all_ones": 1}', '"all_ones": 2}', CONVERTERS),
    _m("f-overflow-without-inf-to-max", "converters", F, "over = limit if self.has_infs or self.has_nan else top",
       "over = limit if self.has_infs else top", CONVERTERS),
    _m("f-nan-sign-dropped", "converters", F, "nan_sign=int(self.dtype.itemsize == 1)", "nan_sign=0", CONVERTERS),
    _m("f-emin-without-zero", "converters", F, "return int(self.has_zero) - self._bias", "return 1 - self._bias",
       CONVERTERS),
    _m("f-carrier-bias", "converters", F, "return self._bias + int(not self.has_zero)", "return self._bias",
       CONVERTERS),
    _m("f-hifloat8-mantissa-bits", "converters", F, "{4: 1, 3: 2, 2: 3, 1: 3, 0: 3}",
       "{4: 1, 3: 2, 2: 3, 1: 2, 0: 3}", CONVERTERS),
    _m("f-max-code-ignores-inf", "converters", F, "- nans - int(self.has_infs)", "- nans", CONVERTERS),
    # -- the simulator's classification: lossscale/training/simulate.py -----------------------------
    _m("s-undetected-counts-harmless", "classification", S, "undetected_overflow=feeds and applied",
       "undetected_overflow=bool(phases) and applied", CLASSIFY),
    _m("s-false-positive-any-skip", "classification", S, "false_positive=not applied and not feeds",
       "false_positive=not applied", CLASSIFY),
    _m("s-ranks-always-agree", "classification", S, "ranks_agree=len(set(decisions)) == 1", "ranks_agree=True",
       CLASSIFY),
    _m("s-skipped-from-detector", "classification", "lossscale/training/records.py",  # the counts' columns
       '_column("the detector saw a finite step (rank 0)")\n    applied: bool = _column("rank 0 applied the step '
       '(every step, with a manager that checks nothing)",\n                            {"skipped_steps": False})',
       '_column("the detector saw a finite step (rank 0)", {"skipped_steps": False})\n    applied: bool = '
       '_column("rank 0 applied the step (every step, with a manager that checks nothing)")', CLASSIFY),
    # -- the FP8 recipes: lossscale/training/recipes.py ---------------------------------------------
    _m("fp8-margin-sign", "fp8", FP, "F32(2.0**-margin)", "F32(2.0**margin)", FP8),
    _m("fp8-history-roll", "fp8", FP, "(F32(0.0), *history[2:], history[0])", "(history[0], *history[2:], F32(0.0))",
       FP8),
    _m("fp8-nan-amax-propagates", "fp8", FP, "F32(np.fmax.reduce(history))", "F32(np.maximum.reduce(history))", FP8),
    _m("fp8-delayed-inf-scale-kept", "fp8", FP,
       "/ F32(amax)\n    return F32(F32_MAX) if math.isinf(s) else s", "/ F32(amax)\n    return s", FP8),
    _m("fp8-current-epsilon-ignored", "fp8", FP, "a = max(F32(amax), F32(self.amax_epsilon)) if",
       "a = F32(amax) if", FP8),
    # -- the arithmetic: sim/kernels.py, the one rounding routine --------------------------------------
    _m("k-ties-to-odd", "arithmetic", K, "+ (((sig >> s) & 1) & even)", "+ ((1 - ((sig >> s) & 1)) & even)",
       ARITHMETIC),
    _m("k-ties-away-dropped", "arithmetic", K, "+ np.int64(mode == RNA) \\", "+ 0 \\", ARITHMETIC),
    _m("k-half-plus-one", "arithmetic", K, "inc = ((mask >> 1) & near)", "inc = (((mask + 1) >> 1) & near)",
       ARITHMETIC),
    _m("k-up-down-swapped", "arithmetic", K, "-np.int64(mode == UP)\n", "-np.int64(mode == DOWN)\n", ARITHMETIC),
    _m("k-rtz-directed", "arithmetic", K, "directed, up = -np.int64((mode == UP) | (mode == DOWN))",
       "directed, up = -np.int64((mode == UP) | (mode == DOWN) | (mode == RTZ))", ARITHMETIC),
    _m("k-odd-sticky-dropped", "arithmetic", K, "return kept | (lost & np.int64(mode == ODD)), lost",
       "return kept, lost", ARITHMETIC),
    _m("k-inexact-misses-round-bit", "arithmetic", K, "lost = np.int64((sig & mask) != 0)",
       "lost = np.int64((sig & (mask >> 1)) != 0)", ARITHMETIC),
    _m("k-tiny-after-boundary", "arithmetic", K, "(unbounded < (2 << man))", "(unbounded <= (2 << man))",
       ARITHMETIC),
    _m("k-tiny-before-boundary", "arithmetic", K, "tiny = exp < tiny_exp if", "tiny = exp <= tiny_exp if",
       ARITHMETIC),
    _m("k-underflow-when-exact", "arithmetic", K, "flags |= UNDERFLOW * (tiny & (flags != 0))",
       "flags |= UNDERFLOW * tiny", ARITHMETIC),
    _m("k-subnormal-quantum-off-by-one", "arithmetic", K, "q = max(exp - man, cfg[QUANTUM])",
       "q = max(exp - man, cfg[QUANTUM] + 1)", ARITHMETIC),
    _m("k-fast-path-edge-binade", "arithmetic", K, "edge = (exp == emin - 1) & (cfg[BEFORE] == 0)",
       "edge = (exp == emin - 2) & (cfg[BEFORE] == 0)", ARITHMETIC),
    _m("k-fast-path-subnormal-sticky-dropped", "arithmetic", K,
       "sig = (sig >> d) | np.int64((sig & ((1 << d) - 1)) != 0)", "sig = sig >> d", ARITHMETIC),
    _m("k-fast-path-subnormal-underflow-dropped", "arithmetic", K,
       "flags |= UNDERFLOW * ((d != 0) & (flags != 0))", "flags |= 0", ARITHMETIC),
    _m("k-overflow-at-limit", "arithmetic", K, "over = bits >= cfg[LIMIT]", "over = bits > cfg[LIMIT]",
       ARITHMETIC),
    _m("k-saturation-overflows-to-inf", "arithmetic", K, "bits = (top if sat | (away == 0) else cfg[OVER])",
       "bits = (top if (away == 0) else cfg[OVER])", ARITHMETIC),
    _m("k-down-negative-overflow-to-max", "arithmetic", K, "\\\n        | (np.int64(mode == DOWN) & sign)",
       "", ARITHMETIC),
    _m("k-exact-inf-not-saturated", "arithmetic", K, "bits = (top if sat else cfg[INFB]) if special else bits",
       "bits = cfg[INFB] if special else bits", ARITHMETIC),
    _m("k-nan-to-zero-flipped", "arithmetic", K, "if sat & (cfg[NAN_TO_ZERO] != 0) else nan_bits",
       "if sat & (cfg[NAN_TO_ZERO] == 0) else nan_bits", ARITHMETIC),
    _m("k-sign-op-inf-not-saturated", "arithmetic", K, "out = bits - (mag == inf)", "out = bits", ARITHMETIC),
    _m("k-binary64-subnormal-exponent", "arithmetic", K, "exp = -1022 - shift if e == 0",
       "exp = -1023 - shift if e == 0", ARITHMETIC),
    _m("k-hybrid-ties-away-boundary", "arithmetic", K, "(mode == HYBRID) & (a < 4)", "(mode == HYBRID) & (a <= 4)",
       ARITHMETIC),
    _m("k-taper-boundary", "arithmetic", K, "man = man0 - np.int64(a > cfg[TAPER1])",
       "man = man0 - np.int64(a >= cfg[TAPER1])", ARITHMETIC),
    # The compiled shortcuts' own lines: a stack of matmuls in one call, the binary32 tree of a sum,
    # the casts' tables.
    _m("k-stack-special-of-b-dropped", "arithmetic", K, "bad, out_bad = special[s] | special_r[s], False",
       "bad, out_bad = special[s], False", STACKS),
    _m("k-stack-inexact-pass-skipped", "arithmetic", K, "if not rounded & INEXACT:", "if False:", STACKS),
    _m("k-tree-rne32-inexact-dropped", "arithmetic", K, "elif r != s and not math.isnan(s):", "elif False:",
       SUMS),
    _m("k-matmul-table-drops-inexact", "arithmetic", K, "return lookup(bits, shift, codes, table_flags, out, flags)",
       "return lookup(bits, shift, codes, table_flags, out, flags) & ~INEXACT", LONG),
    _m("f-narrowing-table-without-guard-bit", "converters", "sim/fpu.py", "shift = 23 - (dst.man_bits + 1)",
       "shift = 23 - dst.man_bits", LONG),
    _m("c-im2col-first-inside-output-off", "arithmetic", C, "lo = min(ow, max(0, (st - 1 - off) // st))",
       "lo = min(ow, max(0, -off // st))", IM2COL),
    _m("c-flipped-kernel-not-reversed", "arithmetic", C, "dst[d + r] = src[s + r_n - np.uint64(1) - r]",
       "dst[d + r] = src[s + r]", _t("test_conv")),
    _m("d-cast-table-keyed-without-destination", "converters", "sim/device/casts.py",
       '"cast", ("convert", src_cfg.tobytes(), cfg.tobytes())', '"cast", ("convert", src_cfg.tobytes())',
       _t("test_lookup::test_cast_tables_are_the_kernels_results")),
)


# -- the scratch trees ---------------------------------------------------------------------------------
def _sync(src: Path, dst: Path) -> None:
    """Make ``dst`` hold ``src``'s files with their times (numba's caches in ``dst`` stay valid for
    unchanged files); ``tests/data`` is linked, not copied."""
    for name in COPIED:
        s, d = src / name, dst / name
        if s.is_file():
            shutil.copy2(s, d)
            continue
        for path in s.rglob("*"):
            rel = path.relative_to(src)
            if "__pycache__" in rel.parts or rel.parts[:2] == ("tests", "data") or path.is_dir():
                continue
            target = dst / rel
            if not target.exists() or target.stat().st_mtime != path.stat().st_mtime \
                    or target.read_bytes() != path.read_bytes():
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, target)
    data = dst / "tests" / "data"
    if not data.exists():
        data.symlink_to(src / "tests" / "data")


def _pytest(tree: Path, tests: tuple[str, ...], timeout: float) -> tuple[str, str]:
    """Run ``tests`` in ``tree``: ("passed" | "failed" | "timeout" | "error", the first failing test or
    pytest's last line)."""
    cmd = [sys.executable, "-m", "pytest", *PYTEST_ARGS, *tests]
    env = {**os.environ, "PYTHONPATH": str(tree)}
    try:
        proc = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return "timeout", f"over {timeout:.0f} s"
    lines = proc.stdout.splitlines()
    failed = [ln.split(" ", 1)[1].split(" - ")[0] for ln in lines if ln.startswith(("FAILED ", "ERROR "))]
    if proc.returncode == 0:
        return "passed", lines[-1] if lines else ""
    if proc.returncode in (1, 2) and failed:  # 2: pytest-xdist's stop at the first failure (-x)
        return "failed", failed[0]
    tail = (proc.stdout + proc.stderr).strip().splitlines()
    return "error", f"pytest exit {proc.returncode}: {tail[-1] if tail else ''}"


def _apply(tree: Path, m: Mutant) -> None:
    path = tree / m.file
    text = path.read_text()
    count = text.count(m.original)
    if count != 1:
        raise SystemExit(f"mutant {m.name}: its original snippet occurs {count} times in {m.file} (must be once)")
    path.write_text(text.replace(m.original, m.replacement))


def run(mutants: list[Mutant], work: Path, timeout: float, baseline: bool) -> list[tuple[Mutant, str, str, float]]:
    base, scratch = work / "base", work / "scratch"
    base.mkdir(parents=True, exist_ok=True)
    _sync(ROOT, base)
    for m in mutants:  # every snippet must be there before anything runs
        if (ROOT / m.file).read_text().count(m.original) != 1:
            raise SystemExit(f"mutant {m.name}: its original snippet is not exactly once in {m.file}")
    if baseline:
        files = list(dict.fromkeys(t for m in mutants for t in m.tests))
        for f in files:
            start = time.monotonic()
            outcome, detail = _pytest(base, (f,), timeout * 3)
            print(f"baseline {f}: {outcome} ({detail}, {time.monotonic() - start:.0f} s)", flush=True)
            if outcome != "passed":
                raise SystemExit(f"the unmutated tree fails {f}: fix that first ({detail})")
    results = []
    for m in mutants:
        shutil.rmtree(scratch, ignore_errors=True)
        shutil.copytree(base, scratch, symlinks=True)
        _apply(scratch, m)
        start = time.monotonic()
        outcome, detail = _pytest(scratch, m.tests, timeout)
        verdict = {"failed": "killed", "passed": "survived"}.get(outcome, outcome)
        results.append((m, verdict, detail, time.monotonic() - start))
        print(f"{m.name:40} {verdict:9} {detail}", flush=True)
    shutil.rmtree(scratch, ignore_errors=True)
    return results


def table(results: list[tuple[Mutant, str, str, float]]) -> str:
    """The results as a Markdown table, and the counts by place."""
    rows = ["| mutant | place | file | result | by | s |", "|---|---|---|---|---|---|"]
    for m, verdict, detail, seconds in results:
        rows.append(f"| {m.name} | {m.place} | {m.file} | {verdict} | {detail} | {seconds:.0f} |")
    places = list(dict.fromkeys(m.place for m, *_ in results))
    rows.append("")
    for place in places:
        mine = [v for m, v, *_ in results if m.place == place]
        rows.append(f"{place}: {sum(v != 'survived' for v in mine)}/{len(mine)} killed")
    total = [v for _, v, *_ in results]
    rows.append(f"all: {sum(v != 'survived' for v in total)}/{len(total)} killed")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", action="append", default=[], metavar="NAME", help="run this mutant (repeatable)")
    parser.add_argument("--place", action="append", default=[], help="run the mutants of this place (repeatable)")
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per mutant's tests (default 600)")
    parser.add_argument("--work", type=Path, default=Path("/tmp/lossscale-mutation"),
                        help="folder for the base copy and the scratch copy (kept between runs: warm caches)")
    parser.add_argument("--no-baseline", action="store_true", help="skip the unmutated run of the guarding tests")
    parser.add_argument("--out", type=Path, help="also write the table to this file")
    args = parser.parse_args(argv)
    names = {m.name for m in MUTANTS}
    if len(names) != len(MUTANTS):
        raise SystemExit("two mutants share a name")
    unknown = [n for n in args.only if n not in names]
    if unknown:
        raise SystemExit(f"unknown mutant {', '.join(unknown)}; see --list")
    chosen = [m for m in MUTANTS
              if (not args.only or m.name in args.only) and (not args.place or m.place in args.place)]
    if args.list:
        for m in chosen:
            print(f"{m.name:40} {m.place:15} {m.file}")
        return 0
    results = run(chosen, args.work, args.timeout, not args.no_baseline)
    text = table(results)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
