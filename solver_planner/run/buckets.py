"""A stage's gradient program on its gradients: once after the stage's last backward, or
bucket by bucket while that backward runs, as the plan prices it.

The stage planner prices the reduction as DDP's buckets do (Wang's thesis ch. 5, the tail of
:mod:`solver_planner.stages.costs`): in the last backward each layer's gradients, as soon as
that layer is done, are cut into buckets of at most ``gradient_bucket`` bytes and reduced one
after another while the backward goes on.  DDP's reducer does not fit: its communication
hooks could issue the program, but DDP wraps plain-tensor parameters only (torch converts
DTensors to local tensors before wrapping), and tensor parallelism's parameters are DTensors
whose partial gradients need their own sum first.  So :class:`OverlappedReduction` keeps the
one piece of DDP needed here: parameter hooks that see a layer's gradients complete, and one
thread that runs the program on each bucket in the order the layers finish.  Every data
replica of a stage runs the same backward graph, so the layers finish, and the buckets reach
the program's groups, in one order on every member; nothing else issues collectives on those
groups.
"""

from __future__ import annotations

import queue
import threading
from typing import Any

import torch

from .stage import local_gradients

__all__ = ["reduce_tensors", "reduce_after_backward", "OverlappedReduction"]


def reduce_tensors(program: dict[str, Any], grads: list[torch.Tensor], groups, rank: int) -> None:
    """The lowered program on ``grads`` in place: flattened into the program's ``[chunks,
    chunk]`` buffer, its calls run by the interpreter ``execute`` checks, copied back (the sum
    over the stage's data replicas)."""
    from ..distributed.interpreter import do_call

    if not grads:
        return
    k = program["data"]["chunks"]
    flat = torch.cat([g.reshape(-1) for g in grads])
    chunk = -(-flat.numel() // k)
    buf = torch.zeros(k * chunk, dtype=flat.dtype, device=flat.device)
    buf[:flat.numel()] = flat
    buf = buf.view(k, chunk)
    for call in program["calls"].get(rank, []):
        do_call(program, rank, buf, groups, call)
    flat = buf.view(-1)
    i = 0
    for g in grads:
        g.copy_(flat[i:i + g.numel()].view_as(g))
        i += g.numel()


def reduce_after_backward(program: dict[str, Any] | None, module, groups, rank: int) -> None:
    """The program once on all of the stage's gradients (``gradient_overlap: false``)."""
    if program is not None:
        reduce_tensors(program, local_gradients(module.parameters()), groups, rank)


def _pieces(grads: list[torch.Tensor], elements: int) -> list[list[torch.Tensor]]:
    """The layer's gradients as buckets of at most ``elements`` elements each (views into the
    gradients, so reducing a bucket reduces them in place), in the layer's parameter order."""
    out: list[list[torch.Tensor]] = [[]]
    room = elements
    for g in grads:
        flat = g.view(-1)
        i = 0
        while i < flat.numel():
            if room == 0:
                out.append([])
                room = elements
            n = min(room, flat.numel() - i)
            out[-1].append(flat[i:i + n])
            i += n
            room -= n
    return [b for b in out if b]


class OverlappedReduction:
    """The program run per bucket during a stage's last backward (module docstring).

    ``arm()`` before the last backward; each layer's last parameter hook then cuts its
    gradients into buckets and hands them to the thread; ``flush()``, once that backward has
    returned, hands over what no hook did (a layer whose weight gradients torch's split
    backward assigns itself, after no hook); ``finish()`` (torch's end-of-backward hook of
    the stage) waits for the thread.  ``buckets_during_backward`` counts the buckets handed
    over while the backward ran."""

    def __init__(self, module, program: dict[str, Any], groups, rank: int, bucket_elements: int):
        self.program, self.groups, self.rank = program, groups, rank
        self.bucket_elements = max(1, int(bucket_elements))
        # each parameter belongs to one layer: a parameter two layers share (GPT-2's token
        # table as the logits weight, on a stage holding both) to the first, whose backward
        # runs last, where its one accumulation (of both uses) happens
        self._params: list[list] = []
        self._owner: dict[int, int] = {}
        for layer in module.layers.values():
            own = [p for p in layer.parameters() if id(p) not in self._owner]
            if not own:
                continue
            for prm in own:
                self._owner[id(prm)] = len(self._params)
                prm.register_post_accumulate_grad_hook(self._accumulated)
            self._params.append(own)
        self._armed = False
        self._left: list[set[int]] = []
        self._sent: list[bool] = []
        self._queue: queue.Queue = queue.Queue()
        self._error: BaseException | None = None
        self._cuda = next(module.parameters()).is_cuda
        self._stream = torch.cuda.Stream() if self._cuda else None
        self.buckets_during_backward = 0
        self.buckets = 0
        self._thread = threading.Thread(target=self._loop, name="gradient-program", daemon=True)
        self._thread.start()

    def arm(self) -> None:
        """The next backward is the step's last: reduce each layer when its gradients are complete."""
        self._armed = True
        self._left = [{id(p) for p in own if p.requires_grad} for own in self._params]
        self._sent = [False] * len(self._params)
        self.buckets_during_backward = self.buckets = 0

    def _accumulated(self, prm) -> None:
        if not self._armed:
            return
        i = self._owner[id(prm)]
        self._left[i].discard(id(prm))
        if not self._left[i] and not self._sent[i]:
            self._send(i, during=True)

    def _send(self, i: int, during: bool) -> None:
        self._sent[i] = True
        # a DTensor's partial gradient is summed over its tensor group here, on the backward's
        # thread, where every rank of the group meets it in the same order
        grads = local_gradients(self._params[i])
        ready = None
        if self._cuda:
            ready = torch.cuda.Event()
            ready.record()
        for bucket in _pieces(grads, self.bucket_elements):
            self._queue.put((bucket, ready))
            self.buckets += 1
            self.buckets_during_backward += during

    def _loop(self) -> None:
        while True:
            bucket, ready = self._queue.get()
            try:
                if self._error is None:
                    if self._stream is not None:
                        self._stream.wait_event(ready)
                        with torch.cuda.stream(self._stream):
                            reduce_tensors(self.program, bucket, self.groups, self.rank)
                    else:
                        reduce_tensors(self.program, bucket, self.groups, self.rank)
            except BaseException as exc:   # re-raised on the training thread by finish()
                self._error = exc
            finally:
                self._queue.task_done()

    @property
    def pending(self) -> bool:
        """Armed for this step and not finished: buckets may still be in flight."""
        return self._armed

    def flush(self) -> None:
        """The last backward has returned: hand over every layer no hook did, in backward order."""
        for i in reversed(range(len(self._params))):
            if not self._sent[i]:
                self._send(i, during=False)

    def finish(self) -> None:
        """Hand over what is left and wait for every bucket (re-raising the thread's error)."""
        self.flush()
        self._armed = False
        self._queue.join()
        if self._stream is not None:
            torch.cuda.current_stream().wait_stream(self._stream)
        if self._error is not None:
            error, self._error = self._error, None
            raise RuntimeError(f"the gradient program failed on rank {self.rank}: {error}") from error
