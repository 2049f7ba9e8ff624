"""The model a plan trains, as real torch modules, one per layer of the layer model.

Layer ``i`` here is layer ``i`` of :func:`solver_planner.stages.layers.layer_model`, so a
plan's stage ``[first, last]`` is a slice of :func:`build_layers`:

* ``transformer:`` specs: ``0`` the embedding (token and position tables), ``1..L``
  pre-norm blocks (LayerNorm, causal multi-head attention with separate q, k, v and output
  projections, no query or key bias; LayerNorm, a 4h GELU MLP, residual adds), ``L+1`` the
  final LayerNorm and the logits, whose weight is the token table when ``tied_embeddings`` (GPT-2/3: a last stage
  without the embedding keeps a copy, which the run keeps equal, Megatron's embedding group);
* ``layers:`` specs (no architecture): each layer is ``Linear(w_in, k) -> GELU -> Linear(k, w)``
  with ``w`` the layer's output elements per sample (``activations`` / dtype size, so the
  tensors crossing stage boundaries have the plan's shapes) and ``k`` chosen so that the
  layer has about its ``params`` (a multiple of :data:`WIDTH_STEP`, so any tensor degree
  that divides a host's devices splits it); the loss is the mean squared error against
  a fixed target.  Skip connections and tied layers of such specs are refused.

Every layer is initialised from its own seed (``seed`` and its index), so a rank builds only
its stage's layers and gets the same weights as the single-process reference.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..errors import OptionError
from ..spec.model import ModelSpec

__all__ = ["ModelShape", "model_shape", "build_layers", "StageModule", "batch", "loss_sum", "make_optimizer",
           "reference", "WIDTH_STEP"]

WIDTH_STEP = 8           # hidden widths of `layers:` models are multiples of this
MAX_PARAMETERS = 2**27   # per model: `run` trains on this machine's processes, in fp32


@dataclass(frozen=True)
class ModelShape:
    """What :func:`build_layers` builds: ``kind`` 'gpt' or 'mlp', and its sizes."""

    kind: str
    layers: int                      # layers of the layer model (embedding and logits included)
    hidden: int = 0                  # gpt
    heads: int = 0
    sequence: int = 0
    vocab: int = 0
    tied: bool = False
    widths: tuple[int, ...] = ()     # mlp: output elements per sample of each layer
    inner: tuple[int, ...] = ()      # mlp: each layer's inner width

    @property
    def parameters(self) -> int:
        if self.kind == "gpt":
            h, L = self.hidden, self.layers - 2
            block = 12 * h * h + 11 * h         # v, o with biases, q, k without; the MLP; two norms
            head = 2 * h + (0 if self.tied else self.vocab * h)
            return (self.vocab + self.sequence) * h + L * block + head
        total, prev = 0, self.widths[0]
        for w, k in zip(self.widths, self.inner):
            total += prev * k + k + k * w + w
            prev = w
        return total

    def boundary_elements(self, layer: int) -> int:
        """Elements per sample of layer ``layer``'s output (what crosses a stage boundary after it)."""
        if self.kind == "gpt":
            return self.sequence * (self.vocab if layer == self.layers - 1 else self.hidden)
        return self.widths[layer]

    def describe(self) -> str:
        if self.kind == "gpt":
            return (f"GPT: {self.layers - 2} blocks of hidden {self.hidden}, {self.heads} heads, sequence"
                    f" {self.sequence}, vocabulary {self.vocab}, logits {'tied to' if self.tied else 'apart from'}"
                    f" the embedding; {self.parameters:,} parameters")
        return (f"a stack of {self.layers} linear layers (the spec has no architecture): Linear -> GELU -> Linear"
                f" per layer, widths {list(self.widths)} at the layers' outputs; {self.parameters:,} parameters")


def _unbuilt_features(t) -> list[str]:
    """The features of a ``transformer:`` spec (or a Hugging Face config) that :class:`Block`
    does not build: training a GPT block in their place would compare the plan with another model."""
    out = []
    if t.kv != t.heads:
        out.append(f"grouped-query attention (kv_heads {t.kv} of {t.heads} heads)")
    if t.activation != "gelu":
        out.append(f"a {t.activation} MLP")
    elif t.ffn != 4 * t.hidden:
        out.append(f"an MLP of width {t.ffn} (not 4 x hidden)")
    if t.position != "learned":
        out.append(f"{t.position} positions")
    elif t.position_rows != t.sequence:
        out.append(f"a position table of {t.position_rows} rows for {t.sequence} tokens")
    if t.norm != "layernorm":
        out.append(t.norm)
    if t.bias is not True:
        out.append("linear layers without biases" if t.bias is False else "biases on the query, key and value only")
    return out


def model_shape(model: ModelSpec) -> ModelShape:
    """The shape :func:`build_layers` builds for ``model``, or :class:`OptionError` naming
    what ``run`` cannot build."""
    training = model.training
    if model.transformer is not None:
        t = model.transformer
        unbuilt = _unbuilt_features(t)
        if unbuilt:
            raise OptionError(f"model '{model.name}': run builds GPT-2/3 blocks (multi-head attention, a 4h GELU MLP,"
                              f" learned positions, LayerNorm, biases) and cannot build {'; '.join(unbuilt)}; it"
                              " refuses rather than train a different model ('stages' and 'plan' price it)")
        if t.hidden % t.heads:
            raise OptionError(f"transformer: hidden {t.hidden} is not a multiple of heads {t.heads}; run cannot split"
                              " the attention into heads")
        shape = ModelShape("gpt", t.layers + 2, t.hidden, t.heads, t.sequence, t.vocab,
                           tied=training is None or training.tied_embeddings)
    else:
        from ..spec.layers import FLOAT_DTYPES

        if not model.layers:
            raise OptionError(f"model '{model.name}' has neither 'transformer' nor 'layers': nothing to train")
        size = FLOAT_DTYPES[training.dtype] if training is not None else 2
        widths, inner = [], []
        prev = None
        for spec in model.layers:
            if spec.skip_to or spec.tied_to:
                what = "skip_to" if spec.skip_to else "tied_to"
                raise OptionError(f"layer '{spec.name}': run builds a plain stack of layers; {what} is not run yet")
            w = max(1, math.ceil(spec.activations / size))
            for _ in range(spec.repeat):
                before = w if prev is None else prev
                per = spec.params / size
                k = max(WIDTH_STEP, round(per / (before + w + 1) / WIDTH_STEP) * WIDTH_STEP)
                widths.append(w)
                inner.append(k)
                prev = w
        shape = ModelShape("mlp", len(widths), widths=tuple(widths), inner=tuple(inner))
    if shape.parameters > MAX_PARAMETERS:
        raise OptionError(f"model '{model.name}' has {shape.parameters:,} parameters; run trains in fp32 on this"
                          f" machine's processes and takes models of at most {MAX_PARAMETERS:,}")
    return shape


class Embedding(nn.Module):
    def __init__(self, s: ModelShape):
        super().__init__()
        self.tokens = nn.Embedding(s.vocab, s.hidden)
        self.positions = nn.Embedding(s.sequence, s.hidden)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(tokens.shape[1], device=tokens.device)
        return self.tokens(tokens) + self.positions(pos)


class Attention(nn.Module):
    """Causal self-attention; under tensor parallelism each rank holds whole heads."""

    def __init__(self, s: ModelShape):
        super().__init__()
        self.head_dim = s.hidden // s.heads
        # no query or key bias: softmax is invariant to a key bias, so its gradient is zero in
        # exact arithmetic, and a query bias's gradient is a sum of terms that cancel (each
        # row of the softmax's gradient sums to zero), so rounding dominates both -- and Adam,
        # which divides by the gradient's own size, would turn that rounding into updates
        self.q = nn.Linear(s.hidden, s.hidden, bias=False)
        self.k = nn.Linear(s.hidden, s.hidden, bias=False)
        self.v = nn.Linear(s.hidden, s.hidden)
        self.o = nn.Linear(s.hidden, s.hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = self.q(x), self.k(x), self.v(x)
        heads = q.shape[-1] // self.head_dim          # the local heads under tensor parallelism
        q, k, v = (z.view(b, t, heads, self.head_dim).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(y.transpose(1, 2).reshape(b, t, heads * self.head_dim))


class MLP(nn.Module):
    def __init__(self, inputs: int, inner: int, outputs: int):
        super().__init__()
        self.up = nn.Linear(inputs, inner)
        self.down = nn.Linear(inner, outputs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.gelu(self.up(x)))


class Block(nn.Module):
    """A pre-norm transformer block."""

    def __init__(self, s: ModelShape):
        super().__init__()
        self.norm1 = nn.LayerNorm(s.hidden)
        self.attention = Attention(s)
        self.norm2 = nn.LayerNorm(s.hidden)
        self.mlp = MLP(s.hidden, 4 * s.hidden, s.hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class Logits(nn.Module):
    """Final norm and logits; ``weight`` is the token table when tied (a copy on a stage
    without the embedding)."""

    def __init__(self, s: ModelShape):
        super().__init__()
        self.norm = nn.LayerNorm(s.hidden)
        self.weight = nn.Parameter(torch.empty(s.vocab, s.hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(self.norm(x), self.weight)


def _init(module: nn.Module, seed: int, index: int) -> None:
    """GPT-2's initialisation (normal, std 0.02; zero biases; unit norms), from the layer's own seed."""
    g = torch.Generator().manual_seed((seed * 1_000_003 + index) % 2**63)
    for name, p in sorted(module.named_parameters()):
        with torch.no_grad():
            if name.endswith("bias"):
                p.zero_()
            elif "norm" in name:
                p.fill_(1.0)
            else:
                p.copy_(torch.randn(p.shape, generator=g) * 0.02)


def build_layers(shape: ModelShape, first: int, last: int, seed: int = 0) -> dict[int, nn.Module]:
    """Layers ``first..last`` (inclusive), each initialised from its own seed.  With a tied
    logits layer and no embedding among them, the logits get a copy of the token table;
    with the embedding, they share its parameter."""
    out: dict[int, nn.Module] = {}
    for i in range(first, last + 1):
        if shape.kind == "mlp":
            before = shape.widths[i - 1] if i else shape.widths[0]
            layer = MLP(before, shape.inner[i], shape.widths[i])
        elif i == 0:
            layer = Embedding(shape)
        elif i == shape.layers - 1:
            layer = Logits(shape)
        else:
            layer = Block(shape)
        _init(layer, seed, i)
        if shape.kind == "gpt" and i == shape.layers - 1 and shape.tied:
            if 0 in out:
                layer.weight = out[0].tokens.weight          # one parameter, as in GPT-2
            else:
                table = Embedding(shape)
                _init(table, seed, 0)
                with torch.no_grad():
                    layer.weight.copy_(table.tokens.weight)
        out[i] = layer
    return out


class StageModule(nn.Module):
    """Layers ``first..last`` run in order; parameters are named ``layers.<i>.…`` with the
    model's layer index, so names agree with the single-process model's."""

    def __init__(self, layers: dict[int, nn.Module]):
        super().__init__()
        self.layers = nn.ModuleDict({str(i): m for i, m in sorted(layers.items())})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for m in self.layers.values():
            x = m(x)
        return x


def batch(shape: ModelShape, step: int, samples: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Step ``step``'s global batch (inputs, targets), the same on every process."""
    g = torch.Generator().manual_seed((seed * 7_919 + step + 1) % 2**63)
    if shape.kind == "gpt":
        tokens = torch.randint(0, shape.vocab, (samples, shape.sequence + 1), generator=g)
        return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
    return (torch.randn(samples, shape.widths[0], generator=g),
            torch.randn(samples, shape.widths[-1], generator=g))


def loss_sum(shape: ModelShape, output: torch.Tensor, target: torch.Tensor, per: int) -> torch.Tensor:
    """This replica's share of a micro-batch's mean loss: the sum over its samples divided
    by the micro-batch's count ``per`` (samples, times tokens for a GPT), so the replicas'
    shares add up to the micro-batch's mean and every gradient is the single-process one."""
    if shape.kind == "gpt":
        total = F.cross_entropy(output.flatten(0, 1).float(), target.flatten(), reduction="sum")
        return total / (per * target.shape[1])
    return F.mse_loss(output.float(), target, reduction="sum") / (per * target.shape[1])


LEARNING_RATE = {"adam": 1e-3, "sgd": 0.1}


def make_optimizer(kind: str, params) -> torch.optim.Optimizer:
    """The spec's optimizer (``adam``; ``sgd``: plain, no momentum), with a fixed learning rate."""
    if kind == "sgd":
        return torch.optim.SGD(params, lr=LEARNING_RATE["sgd"])
    return torch.optim.Adam(params, lr=LEARNING_RATE["adam"])


def reference(shape: ModelShape, steps: int, microbatches: int, microbatch_size: int, optimizer: str = "adam",
              seed: int = 0) -> tuple[list[float], dict[str, torch.Tensor]]:
    """The single-process run every plan must equal: the whole model, each step's global batch
    as ``microbatches`` micro-batches whose gradients accumulate, the mean loss.  Returns the
    loss of every step and every parameter after the last (by the model's names)."""
    model = StageModule(build_layers(shape, 0, shape.layers - 1, seed))
    opt = make_optimizer(optimizer, model.parameters())
    losses = []
    for step in range(steps):
        x, y = batch(shape, step, microbatches * microbatch_size, seed)
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for m in range(microbatches):
            rows = slice(m * microbatch_size, (m + 1) * microbatch_size)
            loss = loss_sum(shape, model(x[rows]), y[rows], microbatch_size) / microbatches
            loss.backward()
            total += loss.item()
        losses.append(total)
        opt.step()
    return losses, {name: p.detach().clone() for name, p in model.named_parameters()}
