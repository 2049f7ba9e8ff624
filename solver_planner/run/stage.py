"""One rank's pipeline stage: its layers with the plan's tensor parallelism, recomputation
and optimizer sharding, wrapped in torch's ``PipelineStage``.

Everything here is torch's own machinery: ``parallelize_module`` (Megatron-LM's column- and
row-parallel linears, sequence parallelism), ``checkpoint_wrapper`` (recomputation),
``fully_shard`` (FSDP2, for optimizer sharding) and ``PipelineStage``.  The one extension is
:class:`BroadcastStage`: torch's stage moves a boundary tensor by point-to-point sends along
a lane of ranks, which cannot express a boundary between stages of different (data, tensor)
layouts; it issues the plan's broadcast schedule instead (the cross-mesh resharding paper,
§3: every unit task one broadcast from its sender to its receivers).
"""

from __future__ import annotations

import time
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage
from torch.distributed.tensor import DTensor, Replicate, Shard

from .job import FSDP_MODES
from .model import ModelShape, StageModule, build_layers

__all__ = ["stage_module", "tensor_plan", "ProgramStage", "BroadcastStage", "local_gradients"]


def tensor_plan(shape: ModelShape, layers: list[int], sequence_parallel: bool) -> dict[str, Any]:
    """Megatron-LM's tensor parallelism of ``layers`` as a ``parallelize_module`` plan:
    q, k, v and the MLP's first linear column-parallel, the output projections row-parallel
    (one all-reduce per sub-layer).  With sequence parallelism the norms work on sequence
    shards and the all-reduces become reduce-scatter / all-gather pairs; the stage's input
    and output stay whole (replicated) tensors, since that is what the boundary schedules move."""
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, PrepareModuleInputOutput,
                                                   PrepareModuleOutput, RowwiseParallel, SequenceParallel)

    if shape.kind == "mlp":
        return {f"layers.{i}.{n}": (ColwiseParallel() if n == "up" else RowwiseParallel())
                for i in layers for n in ("up", "down")}
    blocks = [f"layers.{i}" for i in layers if 0 < i < shape.layers - 1]
    plan: dict[str, Any] = {}
    for b in blocks:
        linears = {f"{b}.attention.{n}": ColwiseParallel() for n in ("q", "k", "v")}
        linears[f"{b}.mlp.up"] = ColwiseParallel()
        if not sequence_parallel:
            plan.update(linears)
            plan[f"{b}.attention.o"] = RowwiseParallel()
            plan[f"{b}.mlp.down"] = RowwiseParallel()
            continue
        plan.update(linears)
        for norm, sub, out in (("norm1", "attention", "o"), ("norm2", "mlp", "down")):
            plan[f"{b}.{norm}"] = SequenceParallel()
            plan[f"{b}.{sub}"] = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
            plan[f"{b}.{sub}.{out}"] = RowwiseParallel(output_layouts=Shard(1))
    if sequence_parallel and blocks:
        first, last = blocks[0], blocks[-1]
        if first == last:  # one block: both conversions on one module (a second key would overwrite)
            plan[first] = PrepareModuleInputOutput(
                input_layouts=(Replicate(),), desired_input_layouts=(Shard(1),), use_local_input=True,
                output_layouts=(Shard(1),), desired_output_layouts=(Replicate(),), use_local_output=True)
        else:
            plan[first] = PrepareModuleInput(input_layouts=(Replicate(),), desired_input_layouts=(Shard(1),),
                                             use_local_output=True)
            plan[last] = PrepareModuleOutput(output_layouts=(Shard(1),), desired_output_layouts=(Replicate(),),
                                             use_local_output=True)
    return plan


class _Stage(StageModule):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = super().forward(x)
        # torch's input-gradient action (I of an I/W split) detaches the stage's outputs in
        # place, which a view (sequence parallelism's gathered output) does not allow
        return x.clone() if x._is_view() else x


def _every_second_product():
    """Selective checkpointing contexts for one layer call (``torch.utils.checkpoint``) under
    torchtitan's ``SelectiveAC`` rule, the cost model's ``selective-op``: count the layer's
    ``mm`` and ``linear`` calls in forward order and re-run every second one; keep the outputs
    of the other compute-intensive operators (torch's own list, which torchtitan starts from:
    a biased product's ``addmm``, batched products, the attention kernels), of the
    reduce-scatters and all-to-alls, and re-run the rest.  On CPU the attention kernel is
    ``_scaled_dot_product_flash_attention_for_cpu``, kept as its GPU counterparts are."""
    from torch._functorch.partitioners import get_default_op_list
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    aten = torch.ops.aten
    products = {aten.mm.default, aten.linear.default}
    kept = {op.default for op in get_default_op_list().compute_intensive_ops} | products | {
        aten._scaled_dot_product_cudnn_attention.default, aten._scaled_dot_product_attention_math.default,
        aten._scaled_dot_product_flash_attention_for_cpu.default, aten.max.default, aten.topk.default,
        torch.ops._c10d_functional.reduce_scatter_tensor.default,
        torch.ops._c10d_functional.all_to_all_single.default}
    count = {"forward": 0, "recompute": 0}

    def policy(ctx, func, *args, **kwargs):
        if func in products:
            mode = "recompute" if ctx.is_recompute else "forward"
            count[mode] += 1
            if count[mode] % 2 == 0:
                return CheckpointPolicy.PREFER_RECOMPUTE
        return CheckpointPolicy.MUST_SAVE if func in kept else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


def checkpointed(layer: torch.nn.Module, recompute: str) -> torch.nn.Module:
    """``layer`` wrapped for ``recompute`` (not ``none``): torch's checkpoint wrapper, with
    :func:`_every_second_product`'s selective contexts under ``selective-op``."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl, checkpoint_wrapper

    extra = {"context_fn": _every_second_product, "early_stop": False} if recompute == "selective-op" else {}
    return checkpoint_wrapper(layer, checkpoint_impl=CheckpointImpl.NO_REENTRANT, **extra)


def stage_module(shape: ModelShape, first: int, last: int, mesh, tensor: int, recompute: str, sharding: str,
                 sequence_parallel: bool, seed: int) -> torch.nn.Module:
    """Layers ``first..last`` on ``mesh`` (dims ``dp``, ``tp``); ``sharding`` 'none' or a ZeRO
    stage, run by FSDP2 as :data:`.job.FSDP_MODES` says (the stage's :class:`ProgramStage`
    sets the backward half)."""
    module = _Stage(build_layers(shape, first, last, seed))
    layers = list(range(first, last + 1))
    if tensor > 1:
        from torch.distributed.tensor.parallel import parallelize_module

        plan = tensor_plan(shape, layers, sequence_parallel)
        if plan:
            parallelize_module(module, mesh["tp"], plan)
    if recompute != "none":
        # whole layers are recomputed ('selective' recomputes attention only in the cost
        # model; run recomputes the whole layer: the numbers are the same, only time differs);
        # 'selective-op' runs torch's selective checkpointing with torchtitan's rule, and as
        # torchtitan 0.3.0 (early_stop=False) re-runs the whole layer's forward, the products
        # after the last tensor backward reads included
        for i in layers:
            module.layers[str(i)] = checkpointed(module.layers[str(i)], recompute)
    if sharding != "none":
        from torch.distributed.fsdp import fully_shard

        after = FSDP_MODES[sharding].reshard_after_forward
        for i in layers:
            fully_shard(module.layers[str(i)], mesh=mesh["dp"], reshard_after_forward=after)
        fully_shard(module, mesh=mesh["dp"], reshard_after_forward=after)
        for m in module.modules():
            if hasattr(m, "set_gradient_divide_factor"):
                # the loss is already each replica's share of the micro-batch mean: sum, not mean;
                # a divide factor would make FSDP reduce with PREMUL_SUM, which gloo lacks
                m.set_gradient_divide_factor(1.0)
                m.set_force_sum_reduction_for_comms(True)
    return module


def local_gradients(params) -> list[torch.Tensor]:
    """Each parameter's local gradient, in the order given.  A partial gradient (a sequence-
    parallel norm's: every tensor rank holds part of the sum) is first summed over the tensor
    ranks, so that the data-parallel program reduces whole gradients."""
    out = []
    for p in params:
        g = p.grad
        if g is None:
            continue
        if isinstance(g, DTensor):
            if any(pl.is_partial() for pl in g.placements):
                g = g.redistribute(g.device_mesh, [Replicate()] * g.device_mesh.ndim)
                p.grad = g
            g = g._local_tensor
        out.append(g)
    return out


def _ignore(*args, **kwargs) -> None:
    return None


class ProgramStage(PipelineStage):
    """A PipelineStage whose gradient reduction is the plan's program.  With ``reducer`` set
    (``gradient_overlap``), each layer's buckets are reduced while the stage's last backward
    goes on (:mod:`.buckets`); otherwise once, in ``perform_reduce_grad``, which torch calls
    right after the stage's last backward.  Either way a late stage's reduction overlaps the
    earlier stages' remaining work, as the plan prices it."""

    after_backward: Callable[[], None] | None = None
    sharding: str = "none"
    reducer: Any = None           # a buckets.OverlappedReduction: the program runs during the last backward
    _deferred_scale: float = 1.0

    def scale_grads(self, grad_scale_factor) -> None:
        """torch scales the gradients right after the last backward; while buckets are still
        being reduced (in place, on another thread), the division waits for them (it commutes
        with the sum over replicas)."""
        if self.reducer is not None and self.reducer.pending:
            self._deferred_scale *= grad_scale_factor
            return
        super().scale_grads(grad_scale_factor)

    def backward_maybe_with_nosync(self, backward_type, bwd_kwargs: dict, last_backward: bool = False):
        """torch's backward; in the step's last one (whole, or its weight half) the reducer,
        when set, reduces each layer as its gradients complete, and every layer left once
        the backward returns."""
        armed = self.reducer is not None and last_backward and backward_type in ("full", "weight")
        if armed:
            self.reducer.arm()
        out = self._backward(backward_type, bwd_kwargs, last_backward)
        if armed:
            self.reducer.flush()
        return out

    def _backward(self, backward_type, bwd_kwargs: dict, last_backward: bool):
        """torch's backward, with FSDP2's flags as the plan's ZeRO stage needs them.  torch
        sets all three off for every backward, which keeps gradients whole and parameters
        gathered until :meth:`perform_reduce_grad`: ZeRO-1.  Under ZeRO-2/3 each backward is a
        last backward, as FSDP2 without pipelining runs it: its gradients are reduce-scattered
        into the shards (ZeRO-3 also frees the gathered parameters), so the setters torch calls
        are held off while it runs."""
        mode = FSDP_MODES.get(self.sharding)
        mod = self.submod
        if mode is None or not mode.sync_every_backward or not hasattr(mod, "set_requires_gradient_sync"):
            return super().backward_maybe_with_nosync(backward_type, bwd_kwargs, last_backward)
        mod.set_is_last_backward(True)
        mod.set_requires_gradient_sync(True)
        mod.set_reshard_after_backward(mode.reshard_after_backward or last_backward)
        held = ("set_is_last_backward", "set_reshard_after_backward", "set_requires_gradient_sync")
        for name in held:
            object.__setattr__(mod, name, _ignore)
        try:
            return super().backward_maybe_with_nosync(backward_type, bwd_kwargs, last_backward)
        finally:
            for name in held:
                object.__delattr__(mod, name)

    def perform_reduce_grad(self, grad_scale_factor):
        if self.reducer is not None and self.reducer.pending:
            self.reducer.finish()
            scale, self._deferred_scale = self._deferred_scale, 1.0
            if scale != 1:
                super().scale_grads(scale)
        super().perform_reduce_grad(grad_scale_factor)
        if self.after_backward is not None:
            self.after_backward()


class BroadcastStage(ProgramStage):
    """A stage whose boundary transfers are the plan's broadcast schedules.

    torch's runtime still decides *when* a boundary moves (its send/receive actions); these
    overrides decide *how*: each unit task is one ``broadcast(async_op=True)`` from its sender
    to its receivers over one process group per (boundary, direction, member set), on a view
    of the micro-batch's ``[samples, elements]`` tile.  The get_*_ops methods issue them and
    hand torch no point-to-point operations; a receive is waited for right before the
    forward or backward that reads it, sends at the end of the step.  Every member issues its
    broadcasts on a group in micro-batch order, then the schedule's task order, so the
    collectives match on every rank."""

    def __init__(self, *args, calls: dict[str, tuple[str, list]], groups: dict, **kwargs):
        super().__init__(*args, **kwargs)
        self._calls = calls      # act_in, act_out, grad_in, grad_out -> (boundary key, [(members, root, box)])
        self._groups = groups    # (boundary key, members) -> ProcessGroup
        self._pending: dict[tuple[str, int], list] = {}
        self._sends: list = []
        self.comm_time = 0.0

    # torch votes over the lane before the first step to learn whether inputs need gradients;
    # every stage here has static shapes that say so, and the lanes of stages of different
    # sizes are not one pipeline, so the vote's point-to-point traffic is skipped
    def _warmup_forward_vote(self, has_backward, received_acc=None):
        return torch.ones(1, dtype=torch.int32)

    def _warmup_backward_result(self, received_result=None):
        return torch.ones(1, dtype=torch.int32)

    def _issue(self, which: str, tile: torch.Tensor) -> list:
        if which not in self._calls:
            return []
        key, calls = self._calls[which]
        me, out = dist.get_rank(), []
        for members, root, box in calls:
            (r0, r1), (c0, c1) = box
            view = tile[r0:r1, c0:c1]
            if root == me:
                t, dest = view.contiguous(), None
            elif view.is_contiguous():
                t, dest = view, None
            else:
                t, dest = torch.empty(view.shape, dtype=tile.dtype, device=tile.device), view
            work = dist.broadcast(t, src=root, group=self._groups[(key, tuple(members))], async_op=True)
            out.append((work, t, dest))
        return out

    def _complete(self, tag: tuple[str, int]) -> None:
        t0 = time.perf_counter()
        for work, t, dest in self._pending.pop(tag, ()):
            work.wait()
            if dest is not None:
                dest.copy_(t)
        self.comm_time += time.perf_counter() - t0

    @staticmethod
    def _rows(t: torch.Tensor) -> torch.Tensor:
        return t.reshape(t.shape[0], -1)

    def get_fwd_send_ops(self, mb):
        if not self.is_last:
            out = self.fwd_cache[mb][0][0].detach()
            self._sends += self._issue("act_out", self._rows(out))
        return []

    def get_fwd_recv_ops(self, mb):
        if not self.is_first:
            buf = self.args_recv_info[mb][0].buffer.detach()
            self._pending[("F", mb)] = self._issue("act_in", buf.view(buf.shape[0], -1))
        return []

    def _retrieve_recv_activations(self, mb):
        self._complete(("F", mb))
        return super()._retrieve_recv_activations(mb)

    def get_bwd_send_ops(self, mb):
        if self.has_backward and not self.is_first:
            g = self.bwd_cache.pop(mb)[0]
            if isinstance(g, DTensor):
                g = g.to_local()
            self._sends += self._issue("grad_out", self._rows(g.detach().contiguous()))
        return []

    def get_bwd_recv_ops(self, mb):
        if self.has_backward and not self.is_last:
            buf = self.grad_recv_info[mb][0].buffer.detach()
            self._pending[("B", mb)] = self._issue("grad_in", buf.view(buf.shape[0], -1))
        return []

    def _retrieve_recv_grads(self, mb):
        self._complete(("B", mb))
        return super()._retrieve_recv_grads(mb)

    def wait_sends(self) -> None:
        t0 = time.perf_counter()
        for work, _, _ in self._sends:
            work.wait()
        self._sends.clear()
        self.comm_time += time.perf_counter() - t0
