"""How many of a cluster's devices a stage plan uses, and why the rest stay idle.

Equal sub-meshes must tile the devices a plan uses: ``stages x mesh devices = used``, with
at most one stage per layer and some micro-batch splitting over the mesh's data degree
(DistIR's configurations; Alpa's mesh shapes, Wang's thesis §4.1).  A cluster of 100 000
GPUs has no such plan for GPT-3 (a global batch of 1 536 splits over at most 32 replicas of
a count dividing 100 000), so real jobs leave devices idle.  The search takes the largest
number of devices, at most the cluster (or ``--devices``), that is a whole part of the
hierarchy (:mod:`solver_planner.subcluster`) and on which such a plan exists by this
arithmetic and the rules of the space searched (a framework's layer splits, chunked
schedules'); memory is the search's to decide.  The choice is arithmetic on the specs and
options, made again when ``check`` runs the search again.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import gcd
from typing import Callable

from ..errors import InfeasibleError, OptionError
from ..spec.base import MAX_MICROBATCHES
from ..subcluster import device_counts, first_devices, representable
from ..topology import Topology
from .costs import divisors
from .layers import LayerModel

__all__ = ["DeviceUse", "choose_devices"]


@dataclass(frozen=True)
class DeviceUse:
    """``used`` of the cluster's ``devices`` (its first ones in rank order), and why the rest idle."""

    devices: int
    used: int
    reason: str = ""

    @property
    def idle(self) -> int:
        return self.devices - self.used

    def as_dict(self) -> dict:
        return {"devices": self.devices, "used": self.used, "idle": self.idle, "reason": self.reason}

    @property
    def part(self) -> str:
        """`` (first N of M devices)`` for titles when some idle, else nothing."""
        return f" (first {self.used:,} of {self.devices:,} devices)" if self.idle else ""


def _divisors(n: int) -> list[int]:
    """Divisors of ``n`` in O(sqrt n) (clusters of thousands of hosts are scanned count by count)."""
    small = [k for k in range(1, int(n ** 0.5) + 1) if n % k == 0]
    return sorted(set(small + [n // k for k in small]))


def _splits(micro: int, size: int, lm: LayerModel) -> bool:
    """Whether a micro-batch of ``micro`` samples splits over the data degree of a mesh of
    ``size`` devices inside one host, for some tensor degree that splits the model's layers
    (stages/costs.py's rule)."""
    return any(micro % (size // t) == 0 and lm.tensor_refusal(t) is None for t in divisors(size))


def _fits(count: int, per_host: int, lm: LayerModel, micro: list[int], stages: int | None,
          rule: Callable[[int, int], bool] | None = None) -> bool:
    """Whether equal meshes can tile ``count`` devices (hosts of ``per_host``, or one host of
    ``count`` when fewer) with at most one stage per layer and a micro-batch that splits;
    ``rule(S, B)``: whether the space searched has plans of ``S`` stages and ``B``
    micro-batches at all (a framework's layer splits, chunked schedules' rules)."""
    L = lm.num_layers

    def stage_count(S: int, m: int) -> bool:
        return S <= L and stages in (None, S) and (rule is None or rule(S, lm.global_batch // m))

    if count < per_host:                     # one host, cut: its meshes are 1 x 2^k and 1 x count
        per_host = count
    hosts = count // per_host
    sizes = [k for k in (2 ** j for j in range(per_host.bit_length())) if k < per_host and per_host % k == 0]
    for m in micro:
        for size in sizes:                   # meshes inside one host
            if stage_count(count // size, m) and _splits(m, size, lm):
                return True
        for t in divisors(per_host):         # meshes of n whole hosts: data degree n x per_host / t
            q = per_host // t
            if m % q or lm.tensor_refusal(t) is not None:
                continue
            # n hosts per stage: n divides the hosts, and its data degree n x q divides m
            if any(stage_count(hosts // n, m) for n in _divisors(gcd(hosts, m // q))):
                return True
    return False


def _microbatch_sizes(lm: LayerModel) -> list[int]:
    counts = [lm.microbatches] if lm.microbatches is not None else [
        k for k in divisors(lm.global_batch) if k <= MAX_MICROBATCHES]
    return sorted({lm.global_batch // k for k in counts if lm.global_batch % k == 0})


def choose_devices(topology: Topology, lm: LayerModel, cap: int | None = None, stages: int | None = None,
                   used: int | None = None, rule: Callable[[int, int], bool] | None = None,
                   rule_text: str = "") -> DeviceUse:
    """The devices a plan uses: ``used`` when a configuration fixes them (``--config``'s
    d x t x p), else the most, at most ``cap``, on which equal meshes can tile (above) and
    the space searched has plans (``rule(stages, micro-batches)``, when it is narrower; what
    it requires is ``rule_text``, for the reason).
    Raises :class:`OptionError` for a cap or count the cluster cannot take, and
    :class:`InfeasibleError` (exit 1) when no count has a plan."""
    N = topology.num_devices
    if cap is not None and not 1 <= cap <= N:
        raise OptionError(f"--devices {cap}: '{topology.name}' has {N:,} devices (give 1..{N:,})")
    limit = N if cap is None else cap
    capped = f"--devices {limit:,} leaves {N - limit:,} out" if limit < N else ""
    if used is not None:
        if used > limit:
            raise OptionError(f"the configuration uses {used:,} devices, more than the {limit:,}"
                              + (" --devices allows" if cap is not None else f" of '{topology.name}'"))
        first_devices(topology, used)        # a clear error when they are not a whole part
        reason = "; ".join(x for x in (capped, f"the configuration uses {used:,}" if used < limit else "") if x)
        return DeviceUse(N, used, reason)
    if stages is not None and stages > limit:
        raise InfeasibleError(f"{stages} stages need at least {stages} devices; '{topology.name}' has {N:,}"
                              + (f" and --devices allows {limit:,}" if limit < N else ""))
    micro = _microbatch_sizes(lm)
    per_host = topology.devices_per_host
    for count in device_counts(topology, limit):
        if _fits(count, per_host, lm, micro, stages, rule):
            if count == limit:
                return DeviceUse(N, count, capped)
            plans = "no plan of equal meshes" if stages is None else f"no plan of {stages} equal meshes"
            why = (f"{plans} uses {count + 1:,} to {limit:,} devices" if count + 1 < limit else
                   f"{plans} uses {limit:,} devices")
            # counts skipped for not being a whole part of the hierarchy are said to be
            parts = any(not representable(topology, c) for c in range(count + 1, limit + 1))
            why += (f" (stages x mesh devices must make the count, with at most one stage per layer"
                    f" ({lm.num_layers}) and a micro-batch of the global batch of {lm.global_batch} split over"
                    f" the mesh's data degree{', on a whole part of the hierarchy' if parts else ''}"
                    f"{'; ' + rule_text if rule_text else ''})")
            return DeviceUse(N, count, "; ".join(x for x in (capped, why) if x))
    what = f"{stages} stages" if stages is not None else "no plan"
    raise InfeasibleError(f"{what}: not possible on any part of '{topology.name}' ({limit:,} devices or fewer) with"
                          f" {lm.num_layers} layers and a global batch of {lm.global_batch}: equal meshes must tile"
                          f" the devices used, with at most one stage per layer and a micro-batch split over each"
                          f" mesh's data degree{'; ' + rule_text if rule_text else ''}")
