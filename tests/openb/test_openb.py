"""The openb benchmark: data conversion, the reference policies' definitions, the protocol, the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infer_ctl.cli.main import main
from infer_ctl.place.frag import FragmentationModel, TaskClass, WorkloadMix
from infer_ctl.sim.openb.data import OpenbError, OpenbNode, OpenbPod, load_pods
from infer_ctl.sim.openb.runner import POLICIES, arrival_order, build_state, simulate


def write_trace(tmp_path: Path, n_nodes: int = 12, n_pods: int = 60, seed: int = 0) -> tuple[Path, Path]:
    """A small synthetic trace in openb's CSV format: 8-GPU and 2-GPU nodes, a mix like openb's."""
    rng = np.random.default_rng(seed)
    nodes = tmp_path / "nodes.csv"
    rows = ["sn,cpu_milli,memory_mib,gpu,model"]
    for i in range(n_nodes):
        gpus, model = (8, "G2") if i % 3 else (2, "T4")
        rows.append(f"node-{i:03d},{96000 if gpus == 8 else 32000},{393216},{gpus},{model}")
    nodes.write_text("\n".join(rows) + "\n")
    pods = tmp_path / "pods.csv"
    rows = ["name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec"]
    for i in range(n_pods):
        kind = rng.integers(5)
        if kind == 0:
            rows.append(f"pod-{i},{int(rng.integers(1, 8)) * 1000},8192,0,0,")
        elif kind in (1, 2):
            rows.append(f"pod-{i},4000,16384,1,{int(rng.choice([250, 500, 700]))},")
        elif kind == 3:
            rows.append(f"pod-{i},8000,32768,1,1000,{'T4' if rng.random() < 0.3 else ''}")
        else:
            rows.append(f"pod-{i},32000,65536,{int(rng.choice([2, 4]))},1000,")
    pods.write_text("\n".join(rows) + "\n")
    return nodes, pods


def test_the_fragmentation_of_the_worked_example_is_300_milli_gpu() -> None:
    mix = WorkloadMix((TaskClass(0, 1000, 1), TaskClass(0, 500, 1)), (0.5, 0.5))
    model = FragmentationModel(mix, ["G2"])
    frag = model.fragmentation(np.array([[1000, 300]]), np.array([10_000]), np.array([[0, 0]]))
    assert frag.tolist() == [300.0]


FRAG_CASES = [
    ("a class that needs more GPUs than the node has sees all idle GPU as fragment",
     TaskClass(0, 1000, 4), [1000, 1000], 2000.0),
    ("a CPU-only class sees all idle GPU as fragment", TaskClass(1000, 0, 0), [1000, 400], 1400.0),
    ("a class restricted to another product sees all idle GPU as fragment",
     TaskClass(0, 500, 1, ("T4",)), [1000, 400], 1400.0),
    ("a class short of CPU sees all idle GPU as fragment", TaskClass(64_000, 500, 1), [1000, 400], 1400.0),
    ("a fitting share class sees only the GPUs too small for it", TaskClass(0, 500, 1), [1000, 400], 400.0),
]


@pytest.mark.parametrize(("case", "cls", "free", "expected"), FRAG_CASES, ids=[c for c, *_ in FRAG_CASES])
def test_fragmentation_follows_fgds_definition(case: str, cls: TaskClass, free: list[int], expected: float) -> None:
    model = FragmentationModel(WorkloadMix((cls,), (1.0,)), ["G2"])
    frag = model.fragmentation(np.array([free]), np.array([32_000]), np.array([[0] * len(free)]))
    assert frag.tolist() == [expected]


def test_the_typical_mix_keeps_the_most_frequent_classes_up_to_95_percent() -> None:
    a, b_, c = TaskClass(1, 1000, 1), TaskClass(2, 500, 1), TaskClass(3, 0, 0)
    mix = WorkloadMix.typical([a] * 90 + [b_] * 6 + [c] * 4)
    assert mix.classes == (a, b_)
    assert mix.popularity == pytest.approx((90 / 96, 6 / 96))


def test_arrivals_stop_before_the_gpu_request_exceeds_tune_times_capacity() -> None:
    pods = [OpenbPod(f"p{i}", 1000, 1024, 1, 500, "") for i in range(10)]
    order = arrival_order(pods, capacity_milli=8000, tune=1.3, rng=np.random.default_rng(0))
    total = sum(p.gpu_milli_total for p in order)
    assert 1.3 * 8000 - 500 < total <= 1.3 * 8000
    assert sorted(p.name for p in order[:10]) == sorted(p.name for p in pods)


def test_openb_nodes_become_resource_slices_with_shareable_gpus() -> None:
    state = build_state([OpenbNode("n1", 96000, 393216, 8, "V100M32"), OpenbNode("n2", 32000, 65536, 0, "")])
    assert int(state.exists.sum()) == 8
    dev = state.slot_device[0][0]
    assert dev is not None and dev.allow_multiple_allocations
    assert dev.memory_bytes == 32510 * 2**20
    assert state.products == ["V100M32"]


BAD_ROWS = [
    ("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1000,10,1,abc\n", "line 2".replace("line ", ":")),
    ("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1000,10,2,500\n", "whole GPUs"),
    ("name,cpu_milli,memory_mib,num_gpu\np,1000,10,1\n", "gpu_milli"),
]


@pytest.mark.parametrize(("text", "needle"), BAD_ROWS, ids=["a non-number names the line and column",
                                                            "a fractional multi-GPU pod is refused",
                                                            "a missing column is named"])
def test_a_malformed_pod_list_is_a_clear_error(tmp_path: Path, text: str, needle: str) -> None:
    path = tmp_path / "pods.csv"
    path.write_text(text)
    with pytest.raises(OpenbError) as info:
        load_pods(path)
    assert needle in str(info.value)


@pytest.mark.parametrize("policy", POLICIES, ids=[f"{p} places a small trace within capacity" for p in POLICIES])
def test_every_policy_runs_the_protocol_within_capacity(tmp_path: Path, policy: str) -> None:
    from infer_ctl.sim.openb.data import load_nodes

    nodes_csv, pods_csv = write_trace(tmp_path)
    nodes, pods = load_nodes(nodes_csv), load_pods(pods_csv)
    result = simulate(nodes, pods, policy, seed=42)
    again = simulate(nodes, pods, policy, seed=42)
    assert result.alloc_pct_at_130 == again.alloc_pct_at_130  # seeded: reproducible
    assert 0 < result.alloc_pct_at_100 <= result.alloc_pct_at_130 <= 100
    assert result.unallocated_gpus_at_130 >= 0
    assert 0 <= result.frag_ratio_pct_at_90 <= 100


def test_fgd_beats_random_on_a_fractional_workload(tmp_path: Path) -> None:
    from infer_ctl.sim.openb.data import load_nodes

    nodes_csv, pods_csv = write_trace(tmp_path, n_nodes=30, n_pods=200)
    nodes, pods = load_nodes(nodes_csv), load_pods(pods_csv)
    fgd = np.mean([simulate(nodes, pods, "fgd", seed=s).alloc_pct_at_130 for s in (1, 2, 3)])
    rnd = np.mean([simulate(nodes, pods, "random", seed=s).alloc_pct_at_130 for s in (1, 2, 3)])
    assert fgd > rnd


def test_bench_placement_prints_one_json_row_per_policy_and_seed(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    nodes_csv, pods_csv = write_trace(tmp_path)
    plot = tmp_path / "alloc.png"
    code = main(["bench", "placement", "--nodes", str(nodes_csv), "--pods", str(pods_csv), "--policy",
                 "fgd,infer-ctl", "--seeds", "42,43", "--json", "--plot", str(plot), "--no-progress"])
    assert code == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["policy"], r["seed"]) for r in rows] == [("fgd", 42), ("fgd", 43), ("infer-ctl", 42),
                                                        ("infer-ctl", 43)]
    keys = {"policy", "seed", "alloc_pct_at_100", "alloc_pct_at_130", "unallocated_gpus_at_130",
            "frag_ratio_pct_at_90", "decision_ms_p50", "decision_ms_p99", "wall_s"}
    assert keys <= set(rows[0])
    assert plot.read_bytes()[:4] == b"\x89PNG"


def test_bench_placement_rejects_an_unknown_policy(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nodes_csv, pods_csv = write_trace(tmp_path)
    code = main(["bench", "placement", "--nodes", str(nodes_csv), "--pods", str(pods_csv), "--policy", "magic"])
    assert code == 2
    assert "unknown policy 'magic'" in capsys.readouterr().err


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 1000), min_size=4, max_size=4), st.integers(0, 3), st.integers(1, 1000),
       st.integers(0, 40_000), st.integers(0, 2))
def test_the_incremental_fragmentation_of_one_changed_gpu_equals_recomputing_it(
    free: list[int], slot: int, take: int, cpu: int, product: int
) -> None:
    mix = WorkloadMix((TaskClass(8000, 1000, 1), TaskClass(4000, 500, 1, ("T4",)), TaskClass(2000, 250, 1),
                       TaskClass(32000, 1000, 2), TaskClass(1000, 0, 0)), (0.3, 0.2, 0.2, 0.2, 0.1))
    model = FragmentationModel(mix, ["G2", "T4", "P100"])
    before = np.array([free])
    products = np.array([[product, product, product, -1]])
    before[0, 3] = 0
    after = before.copy()
    after[0, slot] = max(0, after[0, slot] - take)
    n_fit, rest, total = model.aggregates(before, products)
    incremental = model.after_slot_changes(n_fit, rest, total, np.array([cpu]),
                                           [(products[:, slot], before[:, slot], after[:, slot])])
    assert incremental == pytest.approx(model.fragmentation(after, np.array([cpu]), products))
