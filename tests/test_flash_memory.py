"""The memory model's FlashAttention term against torch's own kernel: what attention keeps
for backward beyond its inputs and output, measured by autograd's saved-tensor hooks."""

from __future__ import annotations

import pytest

from solver_planner.spec.layers import TransformerSpec
from solver_planner.stages.layers import transformer_layers

torch = pytest.importorskip("torch")
F = pytest.importorskip("torch.nn.functional")


def kept_beyond_inputs_and_output(fn, b, a, s, d, dtype) -> int:
    """Bytes autograd keeps for ``fn``'s backward besides q, k, v and the output."""
    q, k, v = (torch.randn(b, a, s, d, dtype=dtype, requires_grad=True) for _ in range(3))
    seen: dict[tuple[int, int], int] = {}

    def pack(t):
        seen[t.data_ptr(), t.nbytes] = t.nbytes
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        o = fn(q, k, v)
    mine = {q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr()}
    return sum(n for (ptr, _), n in seen.items() if ptr not in mine)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_flash_attention_keeps_what_the_memory_model_says(dtype):
    b, a, s, d = 2, 4, 256, 32
    flash = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)   # noqa: E731
    measured = kept_beyond_inputs_and_output(flash, b, a, s, d, getattr(torch, dtype))
    if measured >= a * s * s:          # this torch picked its materializing path on this machine
        pytest.skip("torch ran SDPA without its flash kernel here")
    block = transformer_layers(TransformerSpec(layers=1, hidden=a * d, heads=a, sequence=s, vocab=8), dtype,
                               attention="flash")[1]
    # the attention core's own keep: saved minus what selective recomputation keeps
    assert measured / b == block.saved - block.selective_saved
    # the materialized path keeps at least the a s^2 probabilities: the flash term is not that
    manual = lambda q, k, v: torch.softmax(q @ k.transpose(-1, -2) / d ** 0.5, -1) @ v   # noqa: E731
    assert kept_beyond_inputs_and_output(manual, b, a, s, d, getattr(torch, dtype)) / b >= a * s * s
