"""What a simulation returns: a trajectory :class:`Row` per step and the :class:`Summary`,
typed values whose fields are the files' schema (``trajectory.csv``'s columns, ``summary.json``'s
keys), and :class:`Run`, which holds them as plain dicts for the writers and plots."""

from dataclasses import MISSING, dataclass, field, fields, make_dataclass
from typing import Any

import numpy as np

__all__ = ["Row", "Summary", "Run", "EventRow", "Fp8Row", "ShadowRow", "SCHEMA", "COLUMNS", "COUNTS", "counts",
           "EVENT_COLUMNS", "FP8_COLUMNS", "SHADOW_COLUMNS"]


def _column(help: str, counts: dict[str, Any] | None = None) -> Any:
    """A trajectory column: its help, and the summary figures that count its rows (``counts``:
    ``{summary key: the value counted}``)."""
    return field(metadata={"help": help, "counts": counts or {}})


@dataclass(frozen=True, slots=True)
class Row:
    """One training step, as ``trajectory.csv`` has it (a field per column, in file order)."""

    step: int = _column("the step, from 0")
    loss_scale: float = _column("the scale the step used (rank 0)")
    overflow: bool = _column("some device operation of the step raised a register event, on any rank",
                             {"overflow_steps": True})
    event_phases: str = _column("the phases those operations ran in")
    detector_finite: bool = _column("the detector saw a finite step (rank 0)")
    applied: bool = _column("rank 0 applied the step (every step, with a manager that checks nothing)",
                            {"skipped_steps": False})
    undetected_overflow: bool = _column("applied though an operation that feeds the update raised an event",
                                        {"undetected_overflow_steps": True})
    false_positive: bool = _column("skipped though no operation that feeds the update raised an event",
                                   {"false_positive_steps": True})
    ranks_agree: bool = _column("every rank decided alike", {"rank_disagreement_steps": False})
    ranks_applied: str = _column("each rank's decision (1 applied, 0 skipped), as text")
    register: tuple[int, ...] = _column("the registers summed over ranks as the check found them: 8 numbers (the "
                                        "file writes them space-separated)")
    loss: float = _column("the training loss, summed over ranks")
    baseline_loss: float = _column("the binary32 baseline's training loss")
    grad_max: float = _column("the largest unscaled gradient magnitude (rank 0): the largest scaled one over the "
                              "step's scale, in binary64, on applied and skipped steps alike")
    underflow_fraction: float = _column("the fraction of gradients flushed to zero in binary16 (NaN: not measured)")
    update_error: float = _column("||applied update - binary32 reference update|| / ||reference|| (rank 0; "
                                  "1 on a skipped step)")
    skipped_update_error: float = _column("on a skipped step, the error the update its gradients would have "
                                          "made (NaN: applied)")
    overflow_harm: str = _column("on an overflow step, harmless, harmful, skipped-needless or skipped-needed "
                                 "(empty: no overflow)",
                                 {"harmless_overflow_steps": "harmless", "harmful_overflow_steps": "harmful",
                                  "needless_skip_steps": "skipped-needless", "needed_skip_steps": "skipped-needed"})

    def to_dict(self) -> dict[str, Any]:
        """The row as ``{column: value}``, in file order."""
        return {name: getattr(self, name) for name in COLUMNS}


#: The trajectory's one schema: its columns, in file order, and their types (files.py
#: writes and reads by it), read from :class:`Row`.
SCHEMA: dict[str, type] = {f.name: f.type for f in fields(Row)}
COLUMNS = tuple(SCHEMA)
#: The summary's counts of steps, each from the one column it counts: ``{key: (column, value)}``.
COUNTS: dict[str, tuple[str, Any]] = {key: (f.name, value) for f in fields(Row)
                                      for key, value in f.metadata["counts"].items()}


def counts(rows: list[Row]) -> dict[str, int]:
    """The summary's counts over a trajectory (:data:`COUNTS`)."""
    return {key: int(sum(getattr(r, column) == value for r in rows)) for key, (column, value) in COUNTS.items()}


@dataclass(frozen=True, slots=True)
class EventRow:
    """One device operation that raised a register event, as ``events.csv`` has it: the rank,
    then :class:`sim.Event`'s fields (its step and phase tags)."""

    rank: int
    step: int | None
    phase: str | None
    label: str | None
    op: str
    flags: str
    elements: int


@dataclass(frozen=True, slots=True)
class Fp8Row:
    """One matmul operand's quantisation in one step, as ``fp8.csv`` has it (``shadow.csv`` adds
    the alternative's name). Columns after ``nonfinite`` were added with the block recipes: a
    file written before them reads with their defaults."""

    step: int
    rank: int
    tensor: str  #: label, phase, the matmul's ordinal and operand ``a`` or ``b``
    format: str  #: the element format
    scale: float  #: the (encode) scale it was quantised with (blocks: the smallest block's)
    amax: float  #: its largest magnitude
    saturated: int  #: elements whose cast overflowed (saturated to MAX, or NaN/Inf without saturation)
    nonfinite: int  #: elements that became NaN or Inf
    gemm: str = ""  #: fprop, dgrad, wgrad, or backward (a backward matmul not matched to its layer)
    elements: int = 0  #: its elements
    underflowed: int = 0  #: nonzero finite elements quantised to zero
    blocks: int = 1  #: its scaling blocks (1: a per-tensor scale)
    blocks_saturated: int = 0  #: blocks with a saturated element
    scale_min: float = float("nan")  #: the smallest block scale (NaN: no block has one)
    scale_max: float = float("nan")  #: the largest block scale
    rel_error: float = float("nan")  #: ||quantised - binary32 operand|| / ||binary32 operand|| (2-norms)


#: The event log's columns (``events.csv``), read from :class:`EventRow`.
EVENT_COLUMNS = tuple(f.name for f in fields(EventRow))
#: The FP8 log's columns (``fp8.csv``), read from :class:`Fp8Row`.
FP8_COLUMNS = tuple(f.name for f in fields(Fp8Row))
#: One alternative's quantisation of one operand in one step, as ``shadow.csv`` has it: the
#: alternative's name, then :class:`Fp8Row`'s fields.
ShadowRow = make_dataclass(
    "ShadowRow", [("shadow", str), *((f.name, f.type) if f.default is MISSING else (f.name, f.type, f.default)
                                     for f in fields(Fp8Row))], frozen=True, slots=True)
ShadowRow.__module__ = __name__
#: The shadow log's columns (``shadow.csv``), read from :data:`ShadowRow`.
SHADOW_COLUMNS = tuple(f.name for f in fields(ShadowRow))


@dataclass(frozen=True)
class Summary:
    """A run in figures, as ``summary.json`` has it (a field per key)."""

    arguments: dict[str, Any]
    manager: dict[str, Any]
    profile: dict[str, Any]
    detector: str
    phases: str
    versions: dict[str, str]
    steps_run: int
    stopped_early: str | None
    interrupted: bool
    final: dict[str, float]
    baseline_float32: dict[str, float]
    final_loss_scale: float
    skipped_steps: int
    overflow_steps: int
    undetected_overflow_steps: int
    false_positive_steps: int
    rank_disagreement_steps: int
    harmless_overflow_steps: int
    harmful_overflow_steps: int
    needless_skip_steps: int
    needed_skip_steps: int
    max_quiet_update_error: float
    harmless_error: float
    mean_underflow_fraction: float
    underflow_every: int
    matmul_accumulation: str
    events_recorded: int | None
    first_overflow: dict[str, Any] | None
    top_labels: dict[str, int]
    fp8: dict[str, Any] | None
    #: With shadows: per alternative, its recipe and totals over its rows (``shadow.csv``).
    shadow: dict[str, Any] | None = None
    #: What the end-of-run evaluations (``final``, ``baseline_float32``) could not give, and why,
    #: as "which: reason": an evaluation that raised (its figures are then NaN: the steps are kept
    #: whatever it does), or a figure it reports as not available (a warning it gave).
    evaluation_notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """The summary as ``{key: value}``, in field order."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass
class Run:
    """A finished simulation: one record per step (:meth:`Row.to_dict`), the summary
    (:meth:`Summary.to_dict`), (with ``record_events``) the devices' event logs, one dict per
    event with :data:`EVENT_COLUMNS`, and (with ``fp8``) the per-tensor FP8 log."""

    records: list[dict[str, Any]]
    summary: dict[str, Any]
    args: dict[str, Any] = field(default_factory=dict)
    events: list[dict[str, Any]] = field(default_factory=list)
    #: With an FP8 recipe: one row per tensor per step (:data:`lossscale.training.records.FP8_COLUMNS`).
    fp8: list[dict[str, Any]] = field(default_factory=list)
    #: With shadows: one row per alternative, tensor and step (:data:`SHADOW_COLUMNS`).
    shadow: list[dict[str, Any]] = field(default_factory=list)
    #: Rank 0's parameters after the last step (the arrays the workload trained, in its order) and
    #: the binary32 baseline's: the trained model is not thrown away (``TorchWorkload.trained_model``
    #: makes a torch module of them). None for a run read from a folder (a folder keeps no weights).
    params: Any = field(default=None, compare=False, repr=False)
    baseline_params: Any = field(default=None, compare=False, repr=False)

    def column(self, name: str) -> np.ndarray:
        return np.array([r[name] for r in self.records])


def versions() -> dict[str, str]:
    """The versions a run's summary records: Python, numpy, ml_dtypes and lossscale."""
    import platform

    import ml_dtypes

    from ..version import __version__
    return {"python": platform.python_version(), "numpy": np.__version__, "ml_dtypes": ml_dtypes.__version__,
            "lossscale": __version__}
