"""Vocabulary parallelism over the pipeline ranks (Yeung et al. 2024, "Balancing Pipeline
Parallelism with Vocabulary Parallelism"): every one of the ``pp`` ranks holds rows
``[r V/pp, (r+1) V/pp)`` of the embedding and of the LM head (one matrix when they are tied), so
neither the first nor the last stage carries the vocabulary alone.

The pipeline's stages then hold only the layers (the first keeps learned position embeddings,
the last the final norm): the first takes hidden states, the last returns them. Per step, on
every rank of a pipeline (V_r: this rank's rows; T: tokens; D: hidden size):

1. input (before the schedule): each rank looks up the tokens whose id falls in V_r, zero for the
   others, and the partial (T x D) rows are summed onto the first stage's rank (a reduce over the
   pp group, Sec. 4.1 of the paper);
2. output, per micro-batch, on every rank at the point of its schedule where the last stage has
   just run that micro-batch's forward (:class:`_VocabParallelSchedule`): the last stage's
   output (T x D) is broadcast to the pp group, each rank computes its logits slice ``h @ W_r^T``
   (T x V/pp) and the softmax's statistics are all-reduced: the max (for stability) then the
   sum of exponentials and the target's logit (Sec. 3.1). The cross-entropy's gradient with
   respect to the logits, ``softmax - onehot``, is then local to each slice; its products with
   ``W_r`` (the head input's gradient) are summed onto the last stage's rank (a reduce), its
   products with ``h`` are the gradient of ``W_r``;
3. the last stage's loss for each micro-batch is a placeholder whose backward returns that
   gradient (``_HeadGradient``), so torch's schedule runs the layers' backward unchanged;
4. after the schedule: the first stage's input gradient is broadcast to the pp group and each
   rank back-propagates it into its embedding rows; the shards' gradients are divided by the
   number of micro-batches (as the schedule's ``scale_grads`` does for the stages) and averaged
   over the data-parallel ranks.

These collectives are blocking, between the passes of the schedule, not overlapped with compute:
``meshplan.cost.vocab`` charges them so. Schedules with several stages per rank (interleaved,
zero-bubble) would need the output passes placed per virtual stage (the paper's S and T passes in
its own schedules); they are refused (meshplan.targets).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.pipelining.schedules import Schedule1F1B, ScheduleGPipe, _batch_p2p, _wait_batch_p2p
from torch.distributed.tensor import DTensor, Shard

from meshplan.errors import MeshplanError
from meshplan.runtime.models.init import init_parameters
from meshplan.spec.model import ModelSpec

HIDDEN_DTYPE = torch.float32
"""dtype of the hidden states the output pass broadcasts: the residual stream stays fp32 (the
runtime keeps fp32 parameters and autocasts the matmuls)."""


def _shard_rows(weight: nn.Parameter, pp_mesh: DeviceMesh) -> nn.Parameter:
    """A (V, D) meta parameter as a DTensor holding this rank's V/pp rows (Shard(0) over pp)."""
    rows = weight.shape[0] // pp_mesh.size()
    local = torch.empty(rows, weight.shape[1], device=weight.device, dtype=weight.dtype)
    return nn.Parameter(DTensor.from_local(local, pp_mesh, [Shard(0)], run_check=False,
                                           shape=weight.shape, stride=weight.stride()))


class VocabShards(nn.Module):
    """This pipeline rank's rows of the embedding and the LM head, with the whole model's FQNs
    (``tok_embeddings.weight``, ``output.weight``) as DTensors sharded on the vocabulary over the
    pp mesh, so initialisation, checkpoints and full weights treat them as any sharded parameter."""

    def __init__(self, spec: ModelSpec, pp_mesh: DeviceMesh) -> None:
        super().__init__()
        pp = pp_mesh.size()
        if spec.vocab_size % pp:
            raise MeshplanError(f"vocab_parallel needs vocab_size={spec.vocab_size} divisible by pp={pp}")
        self.spec = spec
        with torch.device("meta"):
            self.tok_embeddings = nn.Embedding(spec.vocab_size, spec.hidden_size)
            self.output = nn.Linear(spec.hidden_size, spec.vocab_size, bias=False)
        self.tok_embeddings.weight = _shard_rows(self.tok_embeddings.weight, pp_mesh)
        if spec.tied_embeddings:
            self.output.weight = self.tok_embeddings.weight
        else:
            self.output.weight = _shard_rows(self.output.weight, pp_mesh)
        self.rows = spec.vocab_size // pp
        self.first_row = pp_mesh.get_local_rank() * self.rows

    @torch.no_grad()
    def init_weights(self, seed: int) -> None:
        """The rows one process would draw for these FQNs (runtime/models/init.py)."""
        init_parameters(self, seed, tied_embeddings=self.spec.tied_embeddings)

    def local_ids(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(row of each id in this shard, clamped; True where the id is one of this shard's rows)."""
        mine = (ids >= self.first_row) & (ids < self.first_row + self.rows)
        return (ids - self.first_row).clamp(0, self.rows - 1), mine

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, S) ids -> (B, S, D) rows of the ids in this shard, zeros for the others;
        (B, S, D) hidden states -> this shard's (B, S, V/pp) slice of the logits, fp32.
        One entry point for both, so FSDP2 gathers the rows around either use."""
        if x.is_floating_point():
            return F.linear(x, self.output.weight.to_local()).float()
        rows, mine = self.local_ids(x)
        return F.embedding(rows, self.tok_embeddings.weight.to_local()) * mine.unsqueeze(-1)


class _HeadGradient(torch.autograd.Function):
    """The last stage's loss of one micro-batch before the output pass has run: its value is a
    placeholder, its backward returns the head input's gradient that the pass leaves in ``box``."""

    @staticmethod
    def forward(ctx, hidden: torch.Tensor, box: dict) -> torch.Tensor:
        ctx.box = box
        ctx.dtype = hidden.dtype
        return hidden.new_zeros((), dtype=torch.float32)

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        if "grad" not in ctx.box:
            raise MeshplanError("the vocabulary-parallel output pass did not run before the backward")
        return (ctx.box.pop("grad") * grad_out).to(ctx.dtype), None


@dataclass
class VocabParallel:
    """The vocabulary shards of this rank and the collectives of one step (module docstring)."""

    shards: VocabShards
    group: dist.ProcessGroup
    """This pipeline's ranks, a group of their own (the schedule's p2p keeps the pp mesh's)."""
    first_rank: int
    last_rank: int
    """Global ranks holding the first and the last stage."""
    is_first: bool
    is_last: bool
    dp_group: dist.ProcessGroup | None
    """Ranks whose gradients this class averages (dp_replicate x dp_shard x cp) when the shards
    are replicated over them (zero 0); None when FSDP2 shards them (zero >= 1) or dp is 1."""
    n_microbatches: int
    _targets: list[torch.Tensor] = field(default_factory=list)
    _outputs: list[torch.Tensor] = field(default_factory=list)
    _boxes: list[dict] = field(default_factory=list)
    _partial: torch.Tensor | None = None
    _input: torch.Tensor | None = None
    _losses: list[torch.Tensor] = field(default_factory=list)

    def begin(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor | None:
        """Step 1 (every rank): the embedding rows of ``tokens`` (B, S), reduced onto the first
        stage; returns its input (B, S, D), a leaf whose gradient the schedule fills, elsewhere None."""
        self._targets = list(targets.tensor_split(self.n_microbatches, dim=0))  # as torch splits
        self._outputs, self._boxes, self._losses = [], [], []
        self._sync_grads(False)
        self._partial = self.shards(tokens)
        rows = self._partial.detach().to(HIDDEN_DTYPE).contiguous()
        dist.reduce(rows, dst=self.first_rank, group=self.group)
        self._input = rows.requires_grad_() if self.is_first else None
        return self._input

    def defer(self, output: torch.Tensor) -> torch.Tensor:
        """Step 3 (last stage, per micro-batch): the placeholder loss of ``output`` (b, S, D)."""
        box: dict = {}
        self._outputs.append(output)
        self._boxes.append(box)
        return _HeadGradient.apply(output, box)

    def output_pass(self, i: int) -> None:
        """Step 2 (every rank, in order, where the schedule places it): micro-batch ``i``'s head and loss."""
        if i != len(self._losses) or (self.is_last and len(self._outputs) <= i):
            raise MeshplanError(f"vocabulary-parallel output pass of micro-batch {i} out of order")
        targets = self._targets[i]
        if self.is_last:
            hidden = self._outputs[i].detach().to(HIDDEN_DTYPE).contiguous()
            self._outputs[i] = None  # the stage keeps its own reference for its backward
        else:
            shape = (*targets.shape, self.shards.spec.hidden_size)
            hidden = torch.empty(shape, dtype=HIDDEN_DTYPE, device=targets.device)
        dist.broadcast(hidden, src=self.last_rank, group=self.group)
        hidden.requires_grad_()
        loss, surrogate = self._cross_entropy(hidden, targets)
        surrogate.backward()  # this slice's part of the head input's gradient, and W_r's
        grad = hidden.grad.contiguous()
        dist.reduce(grad, dst=self.last_rank, group=self.group)
        if self.is_last:
            self._boxes[i]["grad"] = grad
        self._losses.append(loss)

    def _cross_entropy(self, hidden: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(mean cross-entropy over the micro-batch's tokens, a scalar whose gradient with respect
        to this slice's logits is that of the mean: (softmax - onehot) / tokens, Sec. 3.1)."""
        logits = self.shards(hidden)  # (b, S, V/pp)
        rows, mine = self.shards.local_ids(targets)
        peak = logits.detach().amax(dim=-1)
        dist.all_reduce(peak, op=dist.ReduceOp.MAX, group=self.group)
        exp = (logits.detach() - peak.unsqueeze(-1)).exp()
        target_logit = logits.detach().gather(-1, rows.unsqueeze(-1)).squeeze(-1) * mine
        stats = torch.stack([exp.sum(dim=-1), target_logit])
        dist.all_reduce(stats, group=self.group)
        total, target = stats[0], stats[1]
        loss = (total.log() + peak - target).mean()
        coef = exp / total.unsqueeze(-1)
        coef.scatter_add_(-1, rows.unsqueeze(-1), -mine.to(coef.dtype).unsqueeze(-1))
        return loss, (logits * coef).sum() / targets.numel()

    def finish(self) -> torch.Tensor | None:
        """Step 4 (every rank, after the schedule): the embedding's backward, then the shards'
        gradient scaling and data-parallel average. Returns the batch's mean loss (every rank)."""
        if self.is_first:
            if self._input is None or self._input.grad is None:
                raise MeshplanError("the first pipeline stage left no gradient for its input")
            grad = self._input.grad.contiguous()
        else:
            grad = torch.empty_like(self._partial, dtype=HIDDEN_DTYPE)
        dist.broadcast(grad, src=self.first_rank, group=self.group)
        self._sync_grads(True)  # FSDP2 reduce-scatters the step's gradient after this backward
        self._partial.backward(grad.to(self._partial.dtype))
        if hasattr(self.shards, "reshard"):  # FSDP2: free the gathered rows before the optimizer step
            self.shards.reshard()
        self._partial, self._input = None, None
        scale = 1.0 / self.n_microbatches
        dp_size = 1 if self.dp_group is None else dist.get_world_size(self.dp_group)
        with torch.no_grad():
            for p in self.shards.parameters():
                local = p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad
                local.mul_(scale / dp_size)
                if self.dp_group is not None:
                    dist.all_reduce(local, group=self.dp_group)
        if len(self._losses) != self.n_microbatches:
            raise MeshplanError(f"{len(self._losses)} vocabulary-parallel output passes for "
                                f"{self.n_microbatches} micro-batches")
        loss = torch.stack(self._losses).mean()
        self._losses, self._outputs, self._boxes = [], [], []
        return loss

    def _sync_grads(self, enabled: bool) -> None:
        """Under FSDP2: reduce the gradients once per step, after the last backward (zero 1 does so)."""
        if hasattr(self.shards, "set_requires_gradient_sync"):
            self.shards.set_requires_gradient_sync(enabled)


def pass_order(m: int, pp: int, rank: int, *, one_f_one_b: bool) -> list[tuple[bool, int]]:
    """(is forward, micro-batch) in pipeline rank ``rank``'s order: GPipe (all forwards, then all
    backwards) or 1F1B with the warm-up of interleaved 1F1B at v = 1 (2 (pp - 1 - rank) + 1
    forwards, not pp - rank), then one backward and one forward alternately."""
    if not one_f_one_b:
        return [(True, k) for k in range(m)] + [(False, k) for k in range(m)]
    warmup = min(m, 2 * (pp - 1 - rank) + 1)
    order = [(True, k) for k in range(warmup)]
    for k in range(m):
        order.append((False, k))
        if warmup + k < m:
            order.append((True, warmup + k))
    return order


def output_lag(m: int, pp: int, rank: int, *, one_f_one_b: bool) -> int:
    """Forwards of later micro-batches rank ``rank`` runs before the output pass of one
    (:class:`_VocabParallelSchedule`); all of them with GPipe."""
    return pp - 1 - rank if one_f_one_b else m


class _VocabParallelSchedule:
    """Mixin over torch's single-stage GPipe and 1F1B: their order of forward and backward passes
    (torch 2.13's loops, whose private helpers this one uses), every send fired as soon as its pass
    is done, the last stage's loss of each micro-batch :meth:`VocabParallel.defer`'s placeholder,
    and the output passes placed so that no rank waits long for the others:

    - GPipe: all of them after each rank's last forward (every rank reaches that point as the last
      stage finishes its forwards: one synchronisation per step);
    - 1F1B: the pass of micro-batch i after rank r's forward of micro-batch i + pp - 1 - r, with a
      deeper warm-up, 2 (pp - 1 - r) + 1 forwards (interleaved 1F1B's at v = 1) instead of pp - r.
      Between two passes every rank then runs one forward and one backward whose inputs were
      sent in the previous period: rank r's forward is one micro-batch ahead of rank r + 1's and
      its backward one behind. With 1F1B's own warm-up the backwards of one period would chain
      through all ranks (each rank's backward waiting on the next one's in the same period) and
      the pipeline would run a stage at a time. The price is activation memory: rank r holds up
      to 2 (pp - 1 - r) + 1 micro-batches, not pp - r (cost.pipeline.in_flight_chunks charges it).
      tests/runtime/test_vocab_parallel_timing.py checks both orders on a unit-time simulation.
    """

    _one_f_one_b = False

    def __init__(self, stage, n_microbatches: int, vocab: VocabParallel) -> None:
        # loss_fn: what torch's shape inference differentiates on the last stage (zero gradient);
        # the step itself takes the placeholders.
        super().__init__(stage, n_microbatches=n_microbatches, loss_fn=_inference_loss, scale_grads=True)
        self._vocab = vocab

    def _step_microbatches(self, arg_mbs=None, kwarg_mbs=None, target_mbs=None, losses=None,
                           return_outputs=True, loss_kwargs=None):
        arg_mbs, kwarg_mbs = self._check_inputs(arg_mbs, kwarg_mbs, target_mbs, losses)
        self._initialize_stage(arg_mbs[0], kwarg_mbs[0], target_mbs[0] if target_mbs else None, loss_kwargs)
        stage, m, pp = self._stage, self._n_microbatches, self._num_stages
        lag = output_lag(m, pp, stage.stage_index, one_f_one_b=self._one_f_one_b)
        sends: list[dist.Work] = []
        done = 0  # output passes run
        for forward, k in pass_order(m, pp, stage.stage_index, one_f_one_b=self._one_f_one_b):
            if forward:
                _wait_batch_p2p(_batch_p2p(stage.get_fwd_recv_ops(k), desc="fwd_recv"))
                output = stage.forward_one_chunk(k, arg_mbs[k], kwarg_mbs[k], save_forward_output=return_outputs)
                sends += _batch_p2p(stage.get_fwd_send_ops(k), desc="fwd_send")
                if stage.is_last:
                    self._internal_losses.append(self._vocab.defer(output))
                due = m if k == m - 1 else max(0, k - lag + 1)
                for i in range(done, due):
                    self._vocab.output_pass(i)
                done = max(done, due)
            else:
                _wait_batch_p2p(_batch_p2p(stage.get_bwd_recv_ops(k), desc="bwd_recv"))
                stage.backward_one_chunk(k, loss=self._maybe_get_loss(stage, k), last_backward=k == m - 1)
                sends += _batch_p2p(stage.get_bwd_send_ops(k), desc="bwd_send")
        _wait_batch_p2p(sends)
        self._update_losses(stage, losses)
        stage.perform_reduce_grad(m if self.scale_grads else 1)


class VocabParallelGPipe(_VocabParallelSchedule, ScheduleGPipe):
    """torch's GPipe with vocabulary parallelism (module docstring)."""


class VocabParallel1F1B(_VocabParallelSchedule, Schedule1F1B):
    """torch's 1F1B with vocabulary parallelism (module docstring)."""

    _one_f_one_b = True


VOCAB_PARALLEL_SCHEDULES = {"gpipe": VocabParallelGPipe, "1f1b": VocabParallel1F1B}
"""Plan schedule name -> the schedule class that runs it with vocabulary parallelism."""


def _inference_loss(hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return (hidden * 0).sum()


def pipeline_groups(rows: torch.Tensor) -> list[tuple[list[int], dist.ProcessGroup]]:
    """One process group per pipeline (rows of global ranks ordered by pp rank); every rank must
    create all of them, in the same order."""
    return [(row, dist.new_group(ranks=row)) for row in (list(map(int, r)) for r in rows)]
