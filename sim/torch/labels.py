"""Module tracking: each routed operation's label is the path of the module that issued it, found
by forward hooks in the forward pass and by autograd sequence numbers in the backward pass."""

from __future__ import annotations

import bisect
import threading
import weakref

import torch

_CHECKED = "sim.checked"  # the autograd node metadata key of a checked node (its forward's _Spans)


def _tensors(output) -> list[torch.Tensor]:
    """The tensors of a module's output: itself, those of a plain tuple or list, else every
    tensor leaf of its pytree (a model's output classes)."""
    if isinstance(output, torch.Tensor):
        return [output]
    if output.__class__ in (tuple, list) and all(o is None or isinstance(o, torch.Tensor) for o in output):
        return [o for o in output if o is not None]
    return [t for t in torch.utils._pytree.tree_leaves(output) if isinstance(t, torch.Tensor)]


#: The sequence number torch gives the next autograd node made in this thread; AccumulateGrad's.
_next_sequence_nr, _NO_SEQUENCE_NR = torch._C._autograd._get_sequence_nr, 2**64 - 1
_forwards = threading.local()  # this thread's _Spans, as weak references, oldest first


class _Spans:
    """One outermost forward's module paths by autograd sequence number: the nodes numbered from
    ``starts[i]`` up to the next start were made by ``paths[i]`` (None: outside any module). Kept
    alive by its graph (the module outputs' nodes hold it), so that a backward in a later mode
    still finds it."""

    __slots__ = ("starts", "paths", "root", "params", "__weakref__")

    def __init__(self, root: torch.nn.Module) -> None:
        self.starts: list[int] = []
        self.paths: list[str | None] = []
        self.root, self.params = root, None

    def mark(self, path: str | None) -> None:
        """From the next node on, nodes are made by ``path``."""
        seq = _next_sequence_nr()
        if self.starts and self.starts[-1] == seq:  # no node since the last mark
            self.paths[-1] = path
        else:
            self.starts.append(seq)
            self.paths.append(path)

    def param_path(self, param: torch.Tensor) -> str | None:
        """The path of the module owning ``param`` (a shared one: the first), if the root has it."""
        if self.params is None:
            self.params = {}
            for name, m in self.root.named_modules():
                for p in m.parameters(recurse=False):
                    self.params.setdefault(id(p), name)
        return self.params.get(id(param))

    @classmethod
    def begin(cls, root: torch.nn.Module) -> _Spans:
        spans = cls(root)
        live = [r for r in getattr(_forwards, "spans", ()) if r() is not None]
        live.append(weakref.ref(spans))
        _forwards.spans = live
        return spans


def _node_path(node) -> str | None:
    """The module path of the forward that made autograd ``node``, if its forward's record is alive;
    for a parameter's AccumulateGrad, the module owning it in the latest forward that has it."""
    seq = node._sequence_nr()
    for ref in reversed(getattr(_forwards, "spans", ())):
        spans = ref()
        if spans is None or not spans.starts:
            continue
        if seq == _NO_SEQUENCE_NR:
            path = spans.param_path(node.variable)
            if path is not None:
                return path
        elif spans.starts[0] <= seq:
            return spans.paths[bisect.bisect_right(spans.starts, seq) - 1]
    return None
