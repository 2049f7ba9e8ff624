"""``solver-planner show``: describe a cluster, or a model's parameters and FLOPs.  Thin:
the counting is :func:`solver_planner.spec.counts.model_counts`."""

from pathlib import Path

import typer
from rich.table import Table

from .. import units
from ..errors import SpecError, SpecIssue
from ..spec import deciding_key, load_yaml
from ..spec.hf import is_hf_config
from .common import JSON_OPT, console, handles_errors, model_of, print_json, topology_of


def _kind(path: Path) -> str:
    """'model' (a Hugging Face config, or keys that say so), 'plan' (a plan file) or
    'cluster': anything else, an unreadable file included, goes to the cluster loader, which
    says what is wrong."""
    from ..plan.planfile import FORMAT

    try:
        data, _ = load_yaml(path)
    except SpecError:
        return "model" if str(path).lower().endswith(".json") else "cluster"
    if isinstance(data, dict) and data.get("format") == FORMAT:
        return "plan"
    if is_hf_config(path, data):
        return "model"
    found = deciding_key(data)
    return "model" if found is not None and found[0] == "model" else "cluster"


@handles_errors
def show(
    spec: Path = typer.Argument(..., help="Cluster spec, model spec (YAML) or Hugging Face config.json.",
                                show_default=False),
    as_json: bool = JSON_OPT,
) -> None:
    """Describe a cluster (levels, devices, interconnects and what shares them) or a model:
    its unique parameters (a tied logits table once), forward FLOPs per sample, and its shape.

    A model is a YAML spec with 'transformer' or 'layers', a YAML spec with 'hf_config', or
    a Hugging Face config.json (llama, mistral, qwen2, gpt2, gpt_neox), trained at
    min(max_position_embeddings, 4096) tokens unless a YAML spec gives 'sequence'.
    """
    kind = _kind(spec)
    if kind == "plan":
        # neither spec: say what it is and which commands read it, not the cluster loader's
        # complaint about its keys
        raise SpecError(SpecIssue(str(spec), None, "", "a plan file (written by 'plan'), not a cluster or model"
                                  f" spec: 'check CLUSTER MODEL {spec}' re-checks it, 'run CLUSTER MODEL {spec}'"
                                  " trains it, and 'plan --report' draws one"))
    if kind == "model":
        _show_model(spec, as_json)
    else:
        _show_cluster(spec, as_json)


def _show_model(path: Path, as_json: bool) -> None:
    from ..spec.counts import model_counts

    spec = model_of(path)
    info = model_counts(spec)
    if "training" in info:
        from ..targets.search import target_defaults

        # what a --target run prices differently where the spec is silent (its JSON too)
        info["target_defaults"] = target_defaults(spec)
    if as_json:
        print_json(info)
        return
    con = console()
    params = info["parameters"]
    con.print(f"[bold]{info['name']}[/bold] ({info['file']})")
    rows = [("parameters", f"{params:,} ({params / 1e9:.3g} B)" if params >= 1e8 else f"{params:,}"),
            ("forward FLOPs / sample", units.format_flops(info["flops_per_sample"]))]
    if info["kind"] == "transformer":
        rows[-1] = (rows[-1][0], f"{rows[-1][1]} ({info['sequence']} tokens; {units.format_flops(info['flops_per_token'])}"
                                 " per token)")
        gqa = " (grouped-query attention)" if info["kv_heads"] != info["heads"] else ""
        bias = {True: "all linear layers", False: "none", "qkv": "query, key and value only"}[info["bias"]]
        rows += [("layers", f"{info['layers']} blocks, embedding and logits"),
                 ("hidden", str(info["hidden"])),
                 ("heads", f"{info['heads']} query, {info['kv_heads']} key/value{gqa}"),
                 ("ffn", f"{info['ffn_hidden']} ({info['activation']})"),
                 ("vocab", str(info["vocab"])),
                 ("sequence", str(info["sequence"])),
                 ("tied embeddings", "yes" if info["tied_embeddings"] else "no"),
                 ("positions, norm", f"{info['position']}, {info['norm']}"),
                 ("biases", bias),
                 ("query, key, value", "one fused product" if info["fused_qkv"] else "three products"),
                 ("parameters / block", f"{info['parameters_per_block']:,}")]
    else:
        rows += [("layers", f"{info['layers']} (parameters from bytes at {info['dtype_bytes']} bytes each)")]
    t = info.get("training")
    if t is not None:
        rows.append(("training", f"global batch {t['global_batch']}, micro-batches {t['microbatches']},"
                                 f" {t['dtype']}, {t['optimizer']}, recompute {t['recompute']}"))
        # what an iteration does with the gradients changes every prediction: say it
        rows.append(("gradients", f"reduced {'during' if t['gradient_overlap'] else 'after'} the backward"
                                  f" in {t.get('gradient_reduce_dtype') or t['dtype']}, accumulated by"
                                  f" {'an add per micro-batch' if t['gradient_accumulation'] == 'add' else 'fusion (no pass)'},"
                                  f" buckets of {units.format_bytes(t['gradient_bucket'])}"))
        for target, said in info.get("target_defaults", {}).items():
            rows.append((f"  under --target {target}", "; ".join(said)))
        if t.get("sequence_parallel"):
            rows.append(("tensor parallel", "sequence parallel; all-gathers and reduce-scatters "
                         + ("beside their products (tensor_overlap)" if t.get("tensor_overlap")
                            else "between the products")))
    table = Table(show_header=False, box=None)
    table.add_column()
    table.add_column()
    for key, value in rows:
        table.add_row(key, value)
    con.print(table)


def _show_cluster(cluster: Path, as_json: bool) -> None:
    topo = topology_of(cluster)
    info = topo.summary()
    if as_json:
        print_json(info)
        return
    con = console()
    levels = " > ".join(f"{lv['name']} x{lv['count']}" for lv in info["levels"])
    dev = info["device"]
    con.print(f"[bold]{info['name']}[/bold]: {info['devices']} x {dev['name']} "
              f"({units.format_flop_rate(dev['flops'])}, {units.format_bytes(dev['memory'])})")
    con.print(f"levels (outermost first): {levels}; hosts: {info['hosts']} x {info['host_level']}")
    for line in _device_lines(dev):
        con.print(line)
    table = Table(title="interconnects")
    for col in ("name", "serves level", "bandwidth / direction", "latency", "shape", "shared", "ports", "via",
                "efficiency"):
        table.add_column(col)
    for ic in info["interconnects"]:
        table.add_row(ic["name"], ic["level"] or "(via only)", units.format_bandwidth(ic["bandwidth"]),
                      units.format_time(ic["latency"]), ic["shape"],
                      f"{ic['sharing']} ({ic['devices_per_port']} device{'s' * (ic['devices_per_port'] > 1)} each)",
                      str(ic["ports"]), ", ".join(ic["via"]) or "-",
                      ", ".join(f"{k} {v:g}" for k, v in ic["efficiency"].items()) or "1 (every collective)")
    con.print(table)
    con.print(f"collective_overlap: {info['collective_overlap']:g} (how much a hierarchical collective's levels overlap)")


def _device_lines(dev: dict) -> list[str]:
    """The device's rates, its compute block and, for a preset, which keys it filled in."""
    filled = set(dev.get("preset_filled", ()))

    def mark(key: str) -> str:
        return " (preset)" if key in filled or key.split(".")[0] in filled else ""

    out = []
    if "preset" in dev:
        out.append(f"device preset {dev['preset']} (solver_planner/data/devices.yaml); filled in: "
                   f"{', '.join(sorted(filled)) or 'nothing (the spec writes every key)'}")
    bw = dev.get("memory_bandwidth")
    rates = [f"peak {units.format_flop_rate(dev['flops'])}{mark('flops')}"]
    rates += [f"{k} {units.format_flop_rate(v)}{mark('dtype_flops.' + k)}" for k, v in dev.get("dtype_flops", {}).items()]
    rates.append(f"memory {units.format_bytes(dev['memory'])}{mark('memory')}"
                 + (f" ({units.format_bytes(dev['memory_reserved'])} of it reserved)" if dev.get("memory_reserved")
                    else ""))
    rates.append(f"memory bandwidth {units.format_bandwidth(bw)}{mark('memory_bandwidth')}" if bw else
                 "memory bandwidth not given")
    out.append("device: " + ", ".join(rates))
    comp = dev.get("compute")
    if comp:
        parts = [f"matmul efficiency {comp['matmul_efficiency']:g}{mark('compute.matmul_efficiency')}",
                 f"half at {units.format_flops(comp['half_efficiency_flops'])}{mark('compute.half_efficiency_flops')}",
                 f"{units.format_time(comp['kernel_overhead'])} per kernel{mark('compute.kernel_overhead')}",
                 f"memory efficiency {comp['memory_efficiency']:g}{mark('compute.memory_efficiency')}"]
        if comp.get("attention_efficiency") is not None:
            parts.append(f"attention efficiency {comp['attention_efficiency']:g}{mark('compute.attention_efficiency')}")
        out.append("compute: " + ", ".join(parts))
    else:
        out.append("compute: no compute block: " + ("the roofline max(FLOPs / peak, bytes / memory bandwidth)" if bw
                                                    else "FLOPs at the peak rate (memory traffic free)"))
    return out
