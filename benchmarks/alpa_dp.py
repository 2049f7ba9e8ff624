"""Alpa's inter-operator stage DP, ported as a benchmark baseline (not part of the library).

Alpa (Zheng et al., OSDI'22), §5.2 (the DP formulation of its inter-operator pass), cuts
``K`` layers into contiguous stages, gives each stage a submesh of Alpa's shapes and an
intra-operator ("autosharding") configuration, and minimises

    T* = sum of the stage costs + (B - 1) * max stage cost

over plans whose submeshes use *all* devices exactly.  For each candidate ``t_max`` (every
distinct stage cost, in increasing order) a DP ``F(s, k, d)`` gives the least sum of stage
costs of layers ``k..K-1`` in ``s`` stages on ``d`` devices, every stage costing at most
``t_max`` (Alpa eq. 3); the best ``F + (B - 1) * max`` over the candidates is the answer.

This module follows Alpa's source, ``alpa/pipeline_parallel/stage_construction.py`` at
commit b8078a9 (``get_submesh_choices``, ``training_dp``, ``training_dp_impl``: the
function ``cluster_layers_and_slice_mesh`` calls; not the unverified ``training_dp_2``),
and, for the memory rule, ``alpa/pipeline_parallel/stage_profiling.py``
(``get_merged_stages_memory_stats``: ``max_n_succ_stages``).  Our own code; where it
departs from Alpa's it says so:

* Alpa's ``f`` tables are ``float32`` (numba); ours are ``float64`` (no rounding of sums).
* Alpa's innermost loops (end layer, submesh, autosharding choice) are vectorised with
  numpy; the order in which Alpa's strict ``<`` keeps the first of equal candidates (end
  layer from the last down, submesh ascending, config ascending) is kept.  The config is
  chosen first (least stage cost, first index), which can differ from Alpa's loop only
  when two different stage costs give the same ``float64`` sum.
  :func:`training_dp_impl_loops` is the loop-for-loop transcription the tests compare with.
* Rows ``s > min(K, devices)`` of ``F`` are never finite (every stage takes at least one
  layer and one device) and are not computed; Alpa computes them as ``inf``.
* ``skip_infeasible_prefix`` (default on) finds, by bisection over the ``t_max`` values
  Alpa's loop would evaluate, the first whose DP has a solution, and starts Alpa's loop
  there with Alpa's loop state (``last_max_stage_cost``).  Feasibility grows with
  ``t_max``, so the loop returns the same cost and solution as Alpa's; it only skips DPs
  that return ``inf``.  ``skip_infeasible_prefix=False`` runs the literal loop (tested equal).

Solutions are Alpa's: a list of ``((start_layer, end_layer_exclusive), submesh_index,
autosharding_index)`` per stage, first stage first (Alpa's ``forward_stage_layer_ids`` is
``range(start, end)``).

:func:`alpa_inputs` builds Alpa's ``compute_cost`` and ``max_n_succ_stages`` arrays from
this project's stage cost tables (:mod:`solver_planner.stages.costs`) for one (cluster,
model, micro-batch count), in place of what Alpa profiles; so not ported: Alpa's profiling
and its memory accounting (``max_n_succ_stages`` comes from our memory model, the same
rule), its clustering of operators into a few layers (our layers are the unit), its
``stage_imbalance_tolerance`` filter (default off in Alpa), and its logical-mesh choices
(our configs: tensor degree x recomputation).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

import numpy as np

__all__ = ["ALPA_GAP", "INFINITY_N_STAGES", "get_submesh_choices", "training_dp", "training_dp_impl",
           "training_dp_impl_loops", "alpa_objective", "AlpaInputs", "alpa_inputs", "max_n_succ_stages_of",
           "equal_mesh_dp"]

# Alpa, stage_construction.py, training_dp: ``gap = 1e-6`` (hard-coded there, marked to become
# a setting): a t_max closer than this to the last one evaluated is skipped.
ALPA_GAP = 1e-6
# Alpa, stage_profiling.py: the cap of max_n_succ_stages when memory does not limit it.
INFINITY_N_STAGES = 2**20


# -- submesh shapes ------------------------------------------------------------------------------

def get_submesh_choices(num_hosts: int, num_devices_per_host: int, space: str = "all") -> tuple[tuple[int, int], ...]:
    """Alpa's physical submesh shapes (Alpa §5: part of one host of a power-of-two size, or
    whole hosts, shapes that can always tile the cluster; ``get_submesh_choices`` in
    stage_construction.py).

    ``(1, 1), (1, 2), (1, 4), ..., (1, M)`` then ``(n, M)`` for ``n = 2..N`` (``space="all"``),
    or ``n`` a power of two (``"power_of_two"``, Alpa's default ``AutoStageOption``), or a power
    of two up to 4 (``"small_power_of_two"``).  ``M`` must be a power of two, as Alpa asserts.
    """
    out = []
    i = 1
    while i <= num_devices_per_host:
        out.append((1, i))
        i *= 2
    if out[-1][1] != num_devices_per_host:
        raise ValueError(f"Alpa's submesh choices need a power-of-two host size, not {num_devices_per_host}")
    if space == "all":
        out += [(n, num_devices_per_host) for n in range(2, num_hosts + 1)]
    elif space in ("power_of_two", "small_power_of_two"):
        top = num_hosts if space == "power_of_two" else min(num_hosts, 4)
        n = 2
        while n <= top:
            out.append((n, num_devices_per_host))
            n *= 2
    else:
        raise ValueError(f"unknown submesh space {space!r} (all, power_of_two, small_power_of_two)")
    return tuple(out)


def _sizes(submesh_choices) -> np.ndarray:
    return np.array([int(np.prod(s)) for s in submesh_choices], dtype=np.int64)


# -- the DP for one t_max ------------------------------------------------------------------------

def _backtrack(f_argmin: np.ndarray, best_s: int, num_layers: int, num_devices: int, sizes: np.ndarray) -> list:
    """Alpa's walk from F(best_s, 0, N) along the recorded choices (training_dp_impl's tail)."""
    s, layer, devices = best_s, 0, num_devices
    out = []
    while s > 0 and layer < num_layers and devices > 0:
        k, m, c = (int(x) for x in f_argmin[s, layer, devices])
        if k < 0:
            raise AssertionError("backtracking reached an unset cell")
        out.append(((layer, k), m, c))
        s, layer, devices = s - 1, k, devices - int(sizes[m])
    if not (s == 0 and layer == num_layers and devices == 0):
        raise AssertionError("backtracking did not end at F(0, K, 0)")
    return out


def _finish(f, f_stage_max, f_argmin, num_layers, num_devices, num_microbatches, sizes):
    """Alpa's choice of the stage count (least F(s, 0, N), first s on ties), the objective of
    that path and its solution."""
    col = f[1:, 0, num_devices]
    if not np.isfinite(col).any():
        return np.inf, None
    best_s = int(np.argmin(col)) + 1
    total = f[best_s, 0, num_devices] + (num_microbatches - 1) * f_stage_max[best_s, 0, num_devices]
    return float(total), _backtrack(f_argmin, best_s, num_layers, num_devices, sizes)


def training_dp_impl(num_layers, num_devices, num_microbatches, submesh_choices, num_autosharding_configs,
                     compute_cost, max_n_succ_stages, max_stage_cost):
    """One DP of Alpa's ``training_dp_impl`` (Alpa eq. 3) for a fixed ``t_max``, vectorised.

    ``F[s, i, j]``: least sum of stage costs of layers ``i..K-1`` cut into ``s`` stages on
    exactly ``j`` devices; ``F[0, K, 0] = 0``.  A stage of layers ``i..k-1`` on submesh ``m``
    with config ``c`` may be the first of the ``s`` remaining stages when its cost is at most
    ``t_max`` and ``s - 1 <= max_n_succ_stages[i, k-1, m, c]`` (Alpa's memory rule: under
    1F1B the activations a stage keeps grow with the number of stages after it).
    ``F_stage_max`` follows the largest stage cost along the chosen path.  Returns ``(sum +
    (B - 1) * max, solution)`` of the stage count with the least ``F(s, 0, N)``, or
    ``(inf, None)``.
    """
    L, N = int(num_layers), int(num_devices)
    sizes = _sizes(submesh_choices)
    M = len(sizes)
    cost = np.asarray(compute_cost, dtype=float)[:L, :L, :M, :num_autosharding_configs]
    succ = np.asarray(max_n_succ_stages)[:L, :L, :M, :num_autosharding_configs]
    f = np.full((L + 1, L + 1, N + 1), np.inf)
    f_stage_max = np.zeros((L + 1, L + 1, N + 1))
    f_argmin = np.full((L + 1, L + 1, N + 1, 3), -1, dtype=np.int64)
    f[0, L, 0] = 0.0
    # stage i..e exists for e >= i (Alpa's loop k > i) and costs at most t_max
    upper = np.triu(np.ones((L, L), dtype=bool))[:, :, None, None]
    allowed_cost = np.where(upper & (cost <= max_stage_cost), cost, np.inf)
    ii = np.arange(L)[:, None]
    jj = np.arange(N + 1)[None, :]
    for s in range(1, min(L, N) + 1):
        stage = np.where(succ >= s - 1, allowed_cost, np.inf)          # [i, e, m, c]
        best_c = np.argmin(stage, axis=3)                              # first least config
        best = np.take_along_axis(stage, best_c[..., None], axis=3)[..., 0]   # [i, e, m]
        # prev[m, e, j] = F[s-1, e+1, j - size_m] (inf where j < size_m)
        prev = np.full((M, L, N + 1), np.inf)
        for m, n in enumerate(sizes):
            if n <= N:
                prev[m, :, n:] = f[s - 1, 1:, :N + 1 - n]
        cand = best[:, :, :, None] + prev.transpose(1, 0, 2)[None]     # [i, e, m, j]
        # Alpa's loop order: k = e + 1 from K down to i + 1, then m ascending; its strict '<'
        # keeps the first least candidate, as argmin does
        cand = cand[:, ::-1].reshape(L, L * M, N + 1)
        pick = np.argmin(cand, axis=1)                                 # [i, j]
        value = np.take_along_axis(cand, pick[:, None, :], axis=1)[:, 0, :]
        ok = np.isfinite(value)
        ok[:, 0] = False                                               # Alpa's j starts at 1
        if not ok.any():
            break                                                      # every later row is inf too
        e = L - 1 - pick // M
        m = pick % M
        k = e + 1
        c = best_c[ii, e, m]
        j_rest = np.clip(jj - sizes[m], 0, N)
        through = np.maximum(f_stage_max[s - 1][k, j_rest], best[ii, e, m])
        f[s, :L][ok] = value[ok]
        f_stage_max[s, :L][ok] = through[ok]
        f_argmin[s, :L][ok] = np.stack([k, m, c], axis=-1)[ok]
    return _finish(f, f_stage_max, f_argmin, L, N, num_microbatches, sizes)


def training_dp_impl_loops(num_layers, num_devices, num_microbatches, submesh_choices, num_autosharding_configs,
                           compute_cost, max_n_succ_stages, max_stage_cost):
    """:func:`training_dp_impl` as Alpa writes it, loop for loop (slow: for the tests)."""
    L, N = int(num_layers), int(num_devices)
    sizes = _sizes(submesh_choices)
    f = np.full((L + 1, L + 1, N + 1), np.inf)
    f_stage_max = np.zeros((L + 1, L + 1, N + 1))
    f_argmin = np.full((L + 1, L + 1, N + 1, 3), -1, dtype=np.int64)
    f[0, L, 0] = 0.0
    for s in range(1, L + 1):
        for i in range(L - 1, -1, -1):
            for j in range(1, N + 1):
                for k in range(L, i, -1):
                    for m, n in enumerate(sizes):
                        if n > j:
                            continue
                        for c in range(num_autosharding_configs):
                            if s - 1 > max_n_succ_stages[i, k - 1, m, c]:
                                continue
                            stage_cost = compute_cost[i, k - 1, m, c]
                            new_cost = f[s - 1, k, j - n] + stage_cost
                            if stage_cost <= max_stage_cost and new_cost < f[s, i, j]:
                                f[s, i, j] = new_cost
                                f_stage_max[s, i, j] = max(f_stage_max[s - 1, k, j - n], stage_cost)
                                f_argmin[s, i, j] = (k, m, c)
    return _finish(f, f_stage_max, f_argmin, L, N, num_microbatches, sizes)


# -- the enumeration of t_max --------------------------------------------------------------------

def _evaluated_chain(candidates: np.ndarray, gap: float) -> list[int]:
    """Indices of the t_max values Alpa's loop evaluates while no solution is known: it
    skips a value within ``gap`` of the last one evaluated (starting from 0.0), and
    ``inf`` always stops it (``inf * B >= best_cost``)."""
    out, last = [], 0.0
    for idx, t in enumerate(candidates):
        if not np.isfinite(t):
            break
        if t - last < gap:
            continue
        out.append(idx)
        last = t
    return out


def training_dp(num_layers, num_devices, num_microbatches, submesh_choices, num_autosharding_configs,
                compute_cost, max_n_succ_stages, *, gap: float = ALPA_GAP, impl=training_dp_impl,
                skip_infeasible_prefix: bool = True, stats: dict | None = None):
    """Alpa's ``training_dp``: the least ``sum + (B - 1) * max`` over ``t_max`` candidates.

    Candidates are the sorted distinct values of ``compute_cost`` (Alpa §5.2 enumerates
    ``t_max`` over the stage costs).  Two prunings, as Alpa's loop has them:
    a candidate with ``t_max * B >= best_cost`` stops the loop (every plan whose largest
    stage costs at least ``t_max`` has ``sum + (B-1) max >= B t_max``, Alpa §5.2's early
    pruning: ``best_cost - (B - 1) t_max <= t_max``), and a candidate within ``gap`` of the
    last one evaluated is skipped.

    Returns ``(best_cost, solution)``, ``(inf, None)`` when no plan exists.  ``stats``, when
    given, receives ``candidates`` (distinct costs), ``dps`` (DPs run, bisection included),
    ``alpa_dps`` (the DPs Alpa's literal loop runs on this input) and ``seconds``.
    """
    start = time.perf_counter()
    B = num_microbatches
    candidates = np.sort(np.unique(compute_cost))
    if not len(candidates):
        raise ValueError("no stage cost: nothing to construct stages from")
    dps = 0

    def run(t):
        nonlocal dps
        dps += 1
        return impl(num_layers, num_devices, B, submesh_choices, num_autosharding_configs,
                    compute_cost, max_n_succ_stages, t)

    first, last, skipped = 0, 0.0, 0
    if skip_infeasible_prefix:
        chain = _evaluated_chain(candidates, gap)
        lo, hi = 0, len(chain)                 # first position in chain whose DP is feasible
        while lo < hi:
            mid = (lo + hi) // 2
            if np.isfinite(run(candidates[chain[mid]])[0]):
                hi = mid
            else:
                lo = mid + 1
        skipped = lo                           # DPs Alpa's loop runs before the first solution
        if lo == len(chain):
            first = len(candidates)            # no candidate has a solution
        else:
            first = chain[lo]
            last = float(candidates[chain[lo - 1]]) if lo > 0 else 0.0
    best_cost, best_solution = np.inf, None
    looped = 0
    for t in candidates[first:]:
        if t * B >= best_cost:
            break
        if t - last < gap:
            continue
        looped += 1
        cost, solution = run(t)
        if cost < best_cost:
            best_cost, best_solution = cost, solution
        last = t
    if stats is not None:
        stats.update(candidates=int(len(candidates)), dps=dps, alpa_dps=skipped + looped,
                     seconds=time.perf_counter() - start)
    return float(best_cost), best_solution


def alpa_objective(solution, compute_cost, num_microbatches) -> float:
    """Alpa's objective of a solution: sum of its stage costs + (B - 1) x the largest."""
    costs = [float(compute_cost[a, b - 1, m, c]) for (a, b), m, c in solution]
    return sum(costs) + (num_microbatches - 1) * max(costs)


# -- Alpa's inputs from our cost tables ------------------------------------------------------

@dataclass
class AlpaInputs:
    """Alpa's DP inputs for one (cluster, model, micro-batch count).

    ``compute_cost[start, end, m, c]``: forward + backward seconds per micro-batch of layers
    ``start..end`` (inclusive) on ``submesh_choices[m]`` with ``configs[c]`` (inf: below the
    diagonal, or ``c`` not a config of that shape); ``max_n_succ_stages`` likewise (-1: never).
    """

    cluster: str
    model: str
    microbatches: int
    num_hosts: int
    devices_per_host: int
    submesh_choices: tuple
    configs: list
    compute_cost: np.ndarray
    max_n_succ_stages: np.ndarray
    build_seconds: float = 0.0

    @property
    def num_layers(self) -> int:
        return self.compute_cost.shape[0]

    @property
    def num_devices(self) -> int:
        return self.num_hosts * self.devices_per_host

    def restrict(self, submeshes) -> "AlpaInputs":
        """The same instance with only the submesh choices of indices ``submeshes``."""
        idx = list(submeshes)
        return replace(self, submesh_choices=tuple(self.submesh_choices[i] for i in idx),
                       compute_cost=self.compute_cost[:, :, idx, :],
                       max_n_succ_stages=self.max_n_succ_stages[:, :, idx, :])

    def solve(self, **kw):
        """:func:`training_dp` on these inputs."""
        return training_dp(self.num_layers, self.num_devices, self.microbatches, self.submesh_choices,
                           len(self.configs), self.compute_cost, self.max_n_succ_stages, **kw)


def max_n_succ_stages_of(costs, config) -> np.ndarray:
    """``[k, i]``: the most stages that may follow a stage of layers k..i with ``config``.

    Under 1F1B a stage followed by ``s`` stages keeps ``s + 1`` micro-batches' activations:
    the largest ``s`` with ``costs.memory(config, s + 1) <= device memory``; -1 when even one
    micro-batch does not fit; capped at Alpa's ``INFINITY_N_STAGES`` (``stage_profiling.py``,
    ``get_merged_stages_memory_stats``: ``min(max(-1, max_stage), INFINITY_N_STAGES)``).
    Our memory is affine in the live count (:meth:`StageCosts.memory`), so ``s`` is solved
    for, then checked against ``memory`` itself.
    """
    dev = costs.device_memory
    one = costs.memory(config, 1)
    valid = np.isfinite(one)
    with np.errstate(divide="ignore", invalid="ignore"):
        per = np.where(valid, costs.memory(config, 2) - one, 0.0)  # one more live micro-batch
        solved = np.floor((dev - np.where(valid, one - per, 0.0)) / per) - 1
    s = np.where(per > 0, solved, np.where(one <= dev, INFINITY_N_STAGES, -1))
    s = np.clip(np.where(valid, s, -1), -1, INFINITY_N_STAGES).astype(np.int64)
    for _ in range(2):                         # floating-point rounding at the boundary
        over = valid & (s >= 0) & (costs.memory(config, s + 1) > dev)
        s = np.where(over, s - 1, s)
        under = valid & (s < INFINITY_N_STAGES) & (costs.memory(config, s + 2) <= dev)
        s = np.where(under, s + 1, s)
    return s


def alpa_inputs(topology, model, microbatches: int, space: str = "all", search=None) -> AlpaInputs:
    """Alpa's ``compute_cost`` and ``max_n_succ_stages`` from our stage cost tables.

    ``topology``/``model``: a :class:`~solver_planner.topology.Topology` and a
    :class:`~solver_planner.stages.layers.LayerModel` (or spec paths).  The autosharding axis
    is the union of our :class:`StageConfig` (tensor degree, recomputation) over the
    submesh shapes; a config a shape does not have (its tensor degree does not divide the
    host's devices, or its data degree does not divide the micro-batch) costs inf there, as
    Alpa pads a submesh's configs with ``None``.
    """
    from solver_planner.spec import load_model_spec
    from solver_planner.stages.costs import MeshShape, StageCosts
    from solver_planner.stages.layers import layer_model
    from solver_planner.stages.search import StageSearch
    from solver_planner.topology import load_topology

    t0 = time.perf_counter()
    if isinstance(topology, (str, bytes)) or hasattr(topology, "__fspath__"):
        topology = load_topology(topology)
    if isinstance(model, (str, bytes)) or hasattr(model, "__fspath__"):
        model = layer_model(load_model_spec(model))
    search = search or StageSearch(model, topology, "1f1b")
    H, M = topology.num_hosts, topology.devices_per_host
    choices = get_submesh_choices(H, M, space)
    per_shape = []
    for n, d in choices:
        shape = MeshShape(n, d)
        per_shape.append(StageCosts(model, topology, shape, microbatches, search.tables(shape)))
    configs = sorted({c for sc in per_shape for c in sc.configs})
    L = model.num_layers
    cost = np.full((L, L, len(choices), len(configs)), np.inf)
    succ = np.full((L, L, len(choices), len(configs)), -1, dtype=np.int64)
    upper = np.triu(np.ones((L, L), dtype=bool))
    for m, sc in enumerate(per_shape):
        for cfg in sc.configs:
            c = configs.index(cfg)
            cc = sc[cfg]
            cost[:, :, m, c] = np.where(upper, cc.forward + cc.backward, np.inf)
            succ[:, :, m, c] = np.where(upper, max_n_succ_stages_of(sc, cfg), -1)
    return AlpaInputs(cluster=topology.name, model=model.name, microbatches=microbatches, num_hosts=H,
                      devices_per_host=M, submesh_choices=choices, configs=configs, compute_cost=cost,
                      max_n_succ_stages=succ, build_seconds=time.perf_counter() - t0)


def equal_mesh_dp(inputs: AlpaInputs, **kw):
    """Alpa's DP restricted to equal meshes: run it with one submesh choice at a time and
    keep the best.  Returns ``(cost, solution over the full choice indices, submesh index)``."""
    best = (np.inf, None, None)
    for m in range(len(inputs.submesh_choices)):
        if inputs.num_devices % int(np.prod(inputs.submesh_choices[m])):
            continue                           # cannot use every device: Alpa's DP finds nothing
        cost, sol = inputs.restrict([m]).solve(**kw)
        if cost < best[0]:
            best = (cost, [(r, m, c) for r, _, c in sol], m)
    return best
