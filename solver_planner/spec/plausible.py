"""Values a spec accepts but a user almost certainly did not mean: warnings, not errors."""

from __future__ import annotations

__all__ = ["implausible", "MIN_BANDWIDTH", "MAX_LATENCY", "MIN_REDUCTION", "MIN_MEMORY", "MIN_FLOPS",
           "MIXED_16_BIT"]

# Below these, a bare number is almost certainly a unit slip ("400" read as 400 B/s where
# 400 Gbps was meant); above them, a latency is seconds where microseconds were meant.
MIN_BANDWIDTH = 1e6          # bytes/s
MAX_LATENCY = 1.0            # s
MIN_REDUCTION = 64           # bytes per device
MIN_MEMORY = 2**20           # bytes per device
MIN_FLOPS = 1e8              # FLOP/s: below one 1990s CPU core (a calibrated gloo process is about 1e9)

# A reduction in the other 16-bit type: bfloat16 has float32's 8 exponent bits and 7 mantissa
# bits, float16 5 and 10 (IEEE 754 binary16). Every framework target refuses such a reduction;
# a native plan prices it (the bytes are the same) and says what it loses.
MIXED_16_BIT = {
    ("bfloat16", "float16"): "range: values above 65504 overflow to inf, those below about 6e-8 become zero"
                             " (5 exponent bits to bfloat16's 8)",
    ("float16", "bfloat16"): "precision: 3 mantissa bits fewer (7 to float16's 10), so small updates vanish"
                             " in the sum",
}


def implausible(spec) -> list[str]:
    """Warnings for values a user almost certainly did not mean (a cluster or model spec)."""
    src = spec.source
    out = []
    for i, ic in enumerate(getattr(spec, "interconnects", ()) or ()):
        if ic.bandwidth < MIN_BANDWIDTH:
            out.append(f"{src.issue(('interconnects', i, 'bandwidth'), '')}bandwidth {ic.bandwidth:g} B/s is below"
                       " 1 MB/s, likely a unit slip (a number without a unit is bytes per second; write e.g."
                       " '400 Gbps' or '50 GB/s')")
        if ic.latency > MAX_LATENCY:
            out.append(f"{src.issue(('interconnects', i, 'latency'), '')}latency {ic.latency:g} s is above 1 s:"
                       " likely a unit slip (a number without a unit is seconds; write e.g. '5us')")
    device = getattr(spec, "device", None)
    if device is not None:
        out += _device_warnings(device, src)
    training = getattr(spec, "training", None)
    pair = (training.dtype, training.gradient_reduce_dtype) if training is not None else None
    if pair in MIXED_16_BIT:
        out.append(f"{src.issue(('training', 'gradient_reduce_dtype'), '')}{pair[0]} gradients reduced in {pair[1]}"
                   f" lose {MIXED_16_BIT[pair]}; reduce in {pair[0]} or float32")
    for i, red in enumerate(getattr(spec, "reductions", ()) or ()):
        if red.bytes < MIN_REDUCTION:
            out.append(f"{src.issue(('reductions', i, 'bytes'), '')}a reduction of {red.bytes:g} bytes per device:"
                       " likely a unit slip (a number without a unit is bytes; write e.g. '8 MiB')")
    layers = getattr(spec, "layers", ()) or ()
    named = {x.name: x for x in layers}
    for i, x in enumerate(layers):
        shared = named.get(x.tied_to) if x.tied_to is not None else None
        if shared is not None and shared.params != x.params:
            # tied layers share one set of weights; the copy is priced at its own size (its
            # memory, the tie's all-reduce, its optimizer step), so a mismatch is likely a slip
            out.append(f"{src.issue(('layers', i, 'params'), '')}{x.params:,.0f} bytes, but the layer it is tied"
                       f" to ('{shared.name}') has {shared.params:,.0f}: tied layers share one set of weights")
    return out


def _device_warnings(device, src) -> list[str]:
    out = []
    if device.memory < MIN_MEMORY:
        out.append(f"{src.issue(('device', 'memory'), '')}memory {device.memory:g} bytes is below 1 MiB: likely a"
                   " unit slip (a number without a unit is bytes; write e.g. '80 GiB')")
    rates = [(("device", "flops"), device.flops)]
    rates += [(("device", "dtype_flops", k), v) for k, v in device.dtype_flops.items()]
    for path, rate in rates:
        if rate < MIN_FLOPS:
            out.append(f"{src.issue(path, '')}{rate:g} FLOP/s is below 100 MFLOP/s, likely a unit slip (a"
                       " number without a unit is FLOP/s; write e.g. '312 TFLOP/s')")
    if device.memory_bandwidth is not None and device.memory_bandwidth < MIN_BANDWIDTH:
        out.append(f"{src.issue(('device', 'memory_bandwidth'), '')}memory bandwidth {device.memory_bandwidth:g}"
                   " B/s is below 1 MB/s, likely a unit slip (a number without a unit is bytes per second; write"
                   " e.g. '2039 GB/s')")
    if device.preset is None and device.memory_bandwidth is None and device.compute is None:
        out.append(f"{src.issue(('device',), '')}the device has neither a 'preset' nor a 'memory_bandwidth': compute"
                   " is timed at the peak FLOP/s and memory traffic is free, which flatters small kernels (add e.g."
                   " 'preset: A100-SXM4-80GB', or 'memory_bandwidth: 2039 GB/s' for the roofline model)")
    return out
