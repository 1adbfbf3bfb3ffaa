"""One overlapped DualPipe pair of 4 DeepSeek-V3 MoE layers at EP64 on H800 (4096-token
sequence) against DeepSeek's published profile.

The published side is ``benchmarks/data/deepseek_dualpipe_pair.json``: the training trace of
deepseek-ai/profile-data (a forward chunk and a backward chunk of 4 MoE layers each, EP64,
TP1, 4K tokens, balanced routing, no pipeline communication), with its source and how its
figures come from the trace: the pair's span, the compute and communication streams' busy
time, and the share of the communication that runs beside compute.

The predicted side is the phase model (``pipesched.model.phases``): the deepseek-v3 preset's
MoE blocks (layers 3-6) costed at micro-batch 1 x 4096 tokens, FP8 GEMMs (at DeepGEMM's
published H800 rates by shape, the h800 preset's kernel table: nothing is taken from the
trace's kernels), TP1, EP64 on the ``8x8-h800`` cluster preset (NVLink cut to 400 GB/s both
ways, one 400 Gb/s InfiniBand NIC per GPU), every layer's dispatch and combine all-to-all over those links as DeepEP sends them
(``moe_dispatcher="deepep"``: each token across nodes once per destination node, DeepSeek-V3's
routing to at most 4 nodes, what the trace's kernels run); the forward
chunk beside the backward chunk on a compute and a communication stream, the communication
kernels taking 20 of the 132 SMs (``comm_sm_fraction``). Target: the pair within 25% of the
published 129 ms.

    python benchmarks/bench_dualpipe_pair.py                  # prediction against the held data
    python benchmarks/bench_dualpipe_pair.py --trace train.json   # derive the held figures again
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from pipesched.model import TrainingSettings, load_cluster, load_model
from pipesched.model.groups import expert_group_levels
from pipesched.model.phases import chunk_pair, layer_phases, overlap_seconds
from pipesched.model.transformer import layer_ops

DATA = Path(__file__).parent / "data" / "deepseek_dualpipe_pair.json"
FIRST_MOE_BLOCK = 3  # DeepSeek-V3's first 3 blocks are dense
TARGET = 0.25


def predicted(layers: int = 4) -> dict[str, float]:
    """The phase model's pair of ``layers`` DeepSeek-V3 MoE blocks (module docstring), seconds."""
    cluster = load_cluster("8x8-h800")
    settings = TrainingSettings(micro_batch_size=1, seq_len=4096, dtype="fp8", recompute="none",
                                tensor_parallel=1, expert_parallel=64, sequence_parallel=False,
                                moe_dispatcher="deepep")
    groups = expert_group_levels(cluster, settings, 0, settings.tensor_parallel)
    ops = layer_ops(load_model("deepseek-v3"), cluster.devices[0], settings, tp_link=cluster.intra_node, groups=groups)
    # layer_ops lists the embedding first: block i is entry i + 1
    chunk = [layer_phases(entry) for entry in ops[1 + FIRST_MOE_BLOCK:1 + FIRST_MOE_BLOCK + layers]]
    cost = chunk_pair(chunk, chunk, comm_sm_fraction=cluster.devices[0].comm_sm_fraction)
    # the compute stream is busy for the whole pair but the communication it waits for: its
    # compute slowed where communication kernels take their SMs, as the trace's busy time is
    busy = cost.pair_s - cost.exposed_comm_s
    return {"pair_s": cost.pair_s, "compute_s": cost.compute_s, "comm_s": cost.pair_comm_s,
            "hidden_s": cost.pair_hidden_comm_s, "forward_s": cost.forward_s, "backward_s": cost.backward_s,
            "busy_s": busy}


def _union(intervals: list[tuple[float, float]]) -> list[list[float]]:
    merged: list[list[float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return merged


def derive(trace: Path) -> dict[str, float]:
    """The held figures from the published trace (microseconds in the trace, seconds here)."""
    kernels = [e for e in json.loads(trace.read_text(encoding="utf-8"))["traceEvents"] if e.get("cat") == "kernel"]
    streams: dict[int, list[tuple[float, float]]] = {}
    for event in kernels:
        streams.setdefault(event["tid"], []).append((event["ts"], event["ts"] + event["dur"]))
    comm_stream = next(tid for tid in streams if any("dpsk::ep" in e["name"] for e in kernels if e["tid"] == tid))
    compute = _union([span for tid, spans in streams.items() if tid != comm_stream for span in spans])
    comm = _union(streams[comm_stream])
    length = sum(end - start for start, end in comm)
    span = max(e["ts"] + e["dur"] for e in kernels) - min(e["ts"] for e in kernels)
    return {"pair_s": span / 1e6, "compute_busy_s": sum(b - a for a, b in compute) / 1e6,
            "comm_busy_s": length / 1e6, "comm_hidden_s": overlap_seconds(comm, compute) / 1e6,
            "hidden_fraction": overlap_seconds(comm, compute) / length}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", type=Path, help="the published train.json: derive the held figures again")
    args = parser.parse_args()
    published = json.loads(DATA.read_text(encoding="utf-8"))
    if args.trace is not None:
        for name, value in derive(args.trace).items():
            print(f"{name:<16} trace {value:.6f}  held {published[name]:.6f}")
        return
    model = predicted(published["layers"])
    error = (model["pair_s"] - published["pair_s"]) / published["pair_s"]
    hidden = model["hidden_s"] / model["comm_s"]
    print(f"DualPipe F&B pair, {published['layers']} DeepSeek-V3 MoE layers, EP{published['expert_parallel']}, "
          f"TP{published['tensor_parallel']}, {published['seq_len']} tokens, H800")
    print(f"{'':<34} {'predicted':>10} {'published':>10} {'error':>8}")
    rows = (("pair (ms)", model["pair_s"], published["pair_s"]),
            ("communication (ms)", model["comm_s"], published["comm_busy_s"]),
            ("communication hidden (ms)", model["hidden_s"], published["comm_hidden_s"]),
            ("compute, full speed / busy (ms)", model["compute_s"], published["compute_busy_s"]),
            ("compute stream busy (ms)", model["busy_s"], published["compute_busy_s"]))
    for label, ours, theirs in rows:
        print(f"{label:<34} {ours * 1e3:>10.2f} {theirs * 1e3:>10.2f} {(ours - theirs) / theirs:>+8.1%}")
    print(f"{'hidden share of communication':<34} {hidden:>10.1%} {published['hidden_fraction']:>10.1%}")
    print(f"forward chunk alone {model['forward_s'] * 1e3:.2f} ms, backward chunk alone {model['backward_s'] * 1e3:.2f} ms, "
          f"back to back {(model['forward_s'] + model['backward_s']) * 1e3:.2f} ms")
    print(f"pair error {error:+.1%}: {'within' if abs(error) <= TARGET else 'OUTSIDE'} the {TARGET:.0%} target")


if __name__ == "__main__":
    main()
