"""`tracekit predict` end to end on the bundled models: JSON contract, batch CSV from the real e2e corpus, errors,
one batched model call, and predicted traces read back by HTA and `tracekit ingest`."""
from __future__ import annotations

import csv
import gzip
import json
import re

import pytest
from typer.testing import CliRunner

from predictor.predict import predict
from tests.conftest import E2E
from tracekit.cli import app
from tracekit.core.cluster import Cluster
from tracekit.core.config import TrainingConfig

runner = CliRunner()
ARGS = ("--num-layers 8 --hidden-size 1024 --num-attention-heads 16 --seq-length 1024 --micro-batch-size 2 "
        "--global-batch-size 16 --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --fp16")


@pytest.fixture(scope="module")
def models():
    from predictor.costs.learned.models import ModelSet

    return ModelSet.load()


def run(*argv):
    return runner.invoke(app, ["predict", *argv])


def test_json_contract_and_independent_throughput_figures():
    res = run("--megatron-args", ARGS, "--hardware", "A100-SXM4-80GB", "--gpus-per-node", "8", "--json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    for key in ("iteration_time_s", "breakdown", "tflops_per_gpu", "mfu", "tokens_per_s", "memory_gb_per_gpu",
                "warnings", "top_operators", "fallbacks", "per_stage", "operators"):
        assert key in doc
    assert set(doc["breakdown"]) == {"compute", "exposed_communication", "pipeline_bubble", "optimizer", "other"}
    t = doc["iteration_time_s"]
    assert sum(doc["breakdown"].values()) == pytest.approx(t, rel=1e-9)
    assert doc["tokens_per_s"] == pytest.approx(16 * 1024 / t)  # global batch × seq / iteration time
    # Megatron model FLOPs: 72·B·s·L·h²·(1 + s/6h + V/12hL), V padded to 128·tp = 50432
    flops = 72 * 16 * 1024 * 8 * 1024**2 * (1 + 1024 / (6 * 1024) + 50432 / (12 * 1024 * 8))
    assert doc["world_size"] == 4  # tp·pp, dp = 1 when no world size is given
    assert doc["tflops_per_gpu"] == pytest.approx(flops / t / 4 / 1e12)
    assert doc["mfu"] == pytest.approx(doc["tflops_per_gpu"] / 312)  # A100 dense fp16 peak
    assert [s["stage"] for s in doc["per_stage"]] == [0, 1]
    assert {o["pass"] for o in doc["operators"]} >= {"fwd", "bwd", "comm", "optimizer"}
    mem = doc["memory_gb_per_gpu"]
    parts = mem["weights"] + mem["gradients"] + mem["optimizer_state"] + mem["activations"] + mem["workspaces"]
    assert mem["total"] == pytest.approx(parts)


def test_tp_across_nodes_costs_more(models):
    # the same job on 4-GPU nodes: tp groups of 8 cross nodes and must be slower than inside one 8-GPU node
    from predictor.predict import predict

    cfg = TrainingConfig(num_layers=8, hidden_size=4096, num_attention_heads=32, seq_length=2048,
                         micro_batch_size=1, global_batch_size=8, tensor_model_parallel_size=8, precision="fp16")
    inside = predict(cfg, Cluster("A100-SXM4-80GB", 8), models)
    across = predict(cfg, Cluster("A100-SXM4-80GB", 4), models)
    assert across.breakdown["exposed_communication"] > inside.breakdown["exposed_communication"]
    assert across.graph.groups["tp"].nodes == 2


def test_invalid_config_is_one_clear_error():
    res = run("--megatron-args", ARGS.replace("--num-attention-heads 16", "--num-attention-heads 5")
              .replace("--hidden-size 1024", "--hidden-size 1020"), "--hardware", "A100-SXM4-80GB")
    assert res.exit_code == 2
    assert "num_attention_heads 5 is not divisible by tp 2" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


def test_trace_out_onto_a_file_is_one_clear_error(tmp_path):
    taken = tmp_path / "pred.json"
    taken.write_text("{}")
    res = run("--megatron-args", ARGS, "--hardware", "A100-SXM4-80GB", "--trace-out", str(taken))
    assert res.exit_code == 2 and len(res.stderr.strip().splitlines()) == 1
    assert str(taken) in res.stderr and "not a directory" in res.stderr
    assert taken.read_text() == "{}"


def test_unknown_hardware_is_named():
    res = run("--megatron-args", ARGS, "--hardware", "Z9000")
    assert res.exit_code == 2
    assert res.stderr.strip().startswith("error: unknown hardware 'Z9000': no trained models")
    assert "A100-SXM4-80GB" in res.stderr and len(res.stderr.strip().splitlines()) == 1


def test_memory_warning_when_it_does_not_fit(models):
    from predictor.predict import predict

    big = TrainingConfig(num_layers=80, hidden_size=8192, num_attention_heads=64, seq_length=4096,
                         micro_batch_size=1, global_batch_size=8, tensor_model_parallel_size=8, precision="bf16")
    p = predict(big, Cluster("A100-SXM4-80GB", 8), models)
    # 70B parameters / tp 8 ≈ 8.6 G per GPU × (2 + 4 + 12) bytes ≈ 155 GB > 80 GB
    assert p.memory_gb_per_gpu["total"] > 80
    assert any("will not fit" in w for w in p.warnings)


def _e2e_rows(n: int) -> tuple[list[str], list[dict]]:
    """Header and first `n` rows of the shared e2e corpus file, as the csv module reads them."""
    with open(E2E / "vtrain_a100_single_node.csv", newline="") as fh:
        reader = csv.DictReader(fh)
        return list(reader.fieldnames), [row for _, row in zip(range(n), reader)]


def _write_csv(path, header: list[str], rows: list[dict]):
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=header)
        writer.writeheader()
        writer.writerows(rows)
    return path


def test_batch_csv_with_a_bad_row(tmp_path):
    header, rows = _e2e_rows(4)
    rows[1] = dict(rows[1], tp="3")  # 16 heads are not divisible by tp 3 (and the world no longer matches)
    src = _write_csv(tmp_path / "in.csv", header, rows)
    out = tmp_path / "out.csv"
    res = run("--batch", str(src), "--csv-out", str(out), "--set", "attention=unfused")
    assert res.exit_code == 1  # partly done
    assert "line 3" in res.stderr
    with open(out, newline="") as fh:
        got = list(csv.DictReader(fh))
    assert len(got) == 4
    assert all(g[k] == r[k] for g, r in zip(got, rows) for k in header)  # every input column repeated
    assert got[1]["error"] and not got[1]["predicted_iteration_time_s"]
    for g in (got[0], got[2], got[3]):
        assert not g["error"] and float(g["predicted_iteration_time_s"]) > 0
        assert g["hardware_used"] == "A100-SXM4-80GB"  # "NVIDIA A100 (SXM variant/memory not stated)" → A100 models


def test_predict_many_asks_the_models_once(models):
    from predictor.predict import predict_many

    class Counting:
        def __init__(self, inner):
            self.inner, self.frames = inner, []

        def hardware_ids(self):
            return self.inner.hardware_ids()

        def __getattr__(self, name):  # sampled_cluster, sampled_topologies, resolve, framework_us
            return getattr(self.inner, name)

        def predict(self, frame):
            self.frames.append(frame)
            return self.inner.predict(frame)

    counting = Counting(models)
    configs = [TrainingConfig(num_layers=8, hidden_size=h, num_attention_heads=16, seq_length=1024,
                              micro_batch_size=mb, global_batch_size=8, tensor_model_parallel_size=2,
                              precision="fp16") for h in (1024, 2048) for mb in (1, 2)]
    configs.append(TrainingConfig(num_layers=7, hidden_size=1024, num_attention_heads=16, seq_length=1024,
                                  pipeline_model_parallel_size=2))  # 7 layers on 2 stages: invalid
    out = predict_many(configs + configs[:2], Cluster("A100-SXM4-80GB", 8), counting)
    assert len(counting.frames) == 1
    frame = counting.frames[0]
    assert not frame.duplicated().any()  # identical operator rows asked once
    assert isinstance(out[4], Exception) and "num_layers 7" in str(out[4])
    assert out[5].iteration_time_s == out[0].iteration_time_s  # same config, same answer
    assert out[2].iteration_time_s > out[0].iteration_time_s  # hidden 2048 ≈ 4× the GEMM work of 1024


def test_megatron_log_input(tmp_path):
    log = tmp_path / "train.log"
    lines = ["using world size: 4", "------------------------ arguments ------------------------"]
    for key, value in (("num_layers", 4), ("hidden_size", 1024), ("num_attention_heads", 16), ("seq_length", 1024),
                       ("micro_batch_size", 1), ("global_batch_size", 4), ("tensor_model_parallel_size", 2),
                       ("pipeline_model_parallel_size", 2), ("world_size", 4), ("fp16", True)):
        lines.append(f"  {key} {'.' * (40 - len(key))} {value}")
    lines.append("-------------------- end of arguments ---------------------")
    log.write_text("\n".join(lines) + "\n")
    res = run("--megatron-log", str(log), "--hardware", "A100-SXM4-80GB", "--json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["world_size"] == 4 and doc["config"]["precision"] == "fp16" and doc["microbatches"] == 4
    assert doc["calibration"] == "stack:megatron-core" and doc["config"]["attention"] == "flash"
    # Megatron-DeepSpeed prints `deepspeed ... True`: its stack profile (unfused attention, its host constants)
    log.write_text("\n".join(lines[:-1] + [f"  deepspeed {'.' * 31} True", lines[-1]]) + "\n")
    ds = json.loads(run("--megatron-log", str(log), "--hardware", "A100-SXM4-80GB", "--json").stdout)
    assert ds["calibration"] == "stack:megatron-deepspeed-2023" and ds["config"]["attention"] == "unfused"
    assert "stack megatron-deepspeed-2023: the log's arguments block shows it" in ds["warnings"]
    # the profile's host constants apply as if the stack were named (megatron-core has its own since #21 part 6)
    named = json.loads(run("--megatron-log", str(log), "--hardware", "A100-SXM4-80GB", "--stack",
                           "megatron-deepspeed-2023", "--json").stdout)
    assert ds["iteration_time_s"] == named["iteration_time_s"] != doc["iteration_time_s"]


def test_stack_flag_fills_what_the_input_does_not_state(tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text("num_layers: 4\nhidden_size: 1024\nnum_attention_heads: 16\nseq_length: 1024\n")
    old = json.loads(run(str(job), "--hardware", "A100-SXM4-80GB", "--stack", "megatron-lm-2021", "--json").stdout)
    assert old["config"]["attention"] == "unfused" and old["calibration"] == "stack:megatron-lm-2021"
    job.write_text(job.read_text() + "attention: flash\n")  # what the input states wins over the profile
    stated = json.loads(run(str(job), "--hardware", "A100-SXM4-80GB", "--stack", "megatron-lm-2021", "--json").stdout)
    assert stated["config"]["attention"] == "flash"
    res = run(str(job), "--hardware", "A100-SXM4-80GB", "--stack", "megatron-lm-2012")
    assert res.exit_code == 2 and "did you mean 'megatron-lm-2021'" in res.stderr
    # host constants are GPU facts: a CPU prediction under a GPU stack carries none
    from tracekit.core.stacks import get_stack

    assert get_stack("megatron-deepspeed-2023").calibration("cpu-some-cpu").values() == \
        get_stack("gpt-neox").calibration("A100-SXM4-80GB").values()


def test_trace_out_read_back_by_hta(tmp_path):
    res = run("--megatron-args", ARGS + " --sequence-parallel", "--hardware", "A100-SXM4-80GB", "--gpus-per-node",
              "4", "--trace-out", str(tmp_path), "--json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert sorted(p.rsplit("/", 1)[1] for p in doc["trace_files"]) == ["rank-0.json.gz", "rank-2.json.gz"]
    from hta.trace_analysis import TraceAnalysis

    analysis = TraceAnalysis(trace_dir=str(tmp_path))
    assert sorted(analysis.t.traces.keys()) == [0, 2]  # first rank of each stage: stage stride tp·cp·dp = 2
    breakdown = analysis.get_temporal_breakdown(visualize=False)
    assert (breakdown["compute_time(us)"] > 0).all()
    assert (breakdown["non_compute_time(us)"] > 0).all()  # NCCL kernels are communication to HTA
    raw = json.loads(gzip.decompress((tmp_path / "rank-0.json.gz").read_bytes()))
    plain = tmp_path / "plain"
    assert run("--megatron-args", ARGS + " --sequence-parallel", "--hardware", "A100-SXM4-80GB", "--gpus-per-node",
               "4", "--trace-out", str(plain), "--trace-plain").exit_code == 0
    assert sorted(p.name for p in plain.iterdir()) == ["rank-0.json", "rank-2.json"]
    assert json.loads((plain / "rank-0.json").read_text()) == raw  # the same trace, uncompressed
    kernels = [e for e in raw["traceEvents"] if e.get("cat") == "kernel"]
    nccl = [e for e in kernels if e["name"].startswith("ncclDevKernel_")]
    assert {e["args"]["Process Group Description"] for e in nccl} >= {"TENSOR_MODEL_PARALLEL_GROUP",
                                                                       "PIPELINE_MODEL_PARALLEL_GROUP"}
    steps = [e for e in raw["traceEvents"] if e["name"].startswith("ProfilerStep#") and e["cat"] == "user_annotation"]
    assert len(steps) == 2 and steps[0]["dur"] == pytest.approx(doc["iteration_time_s"] * 1e6)


def test_trace_out_read_back_by_ingest(tmp_path):
    traces = tmp_path / "traces"
    res = run("--megatron-args", ARGS, "--hardware", "A100-SXM4-80GB", "--trace-out", str(traces))
    assert res.exit_code == 0, res.output
    store = tmp_path / "store"
    res = runner.invoke(app, ["ingest", str(traces), "--store", str(store), "--json"])
    assert res.exit_code == 0, res.output
    from tracekit.core.store import SampleStore

    samples = SampleStore(store).read(hardware="A100-SXM4-80GB")
    rank0 = samples[samples["rank"] == 0]
    gemm = rank0[rank0["primitive"] == "gemm"]
    # stage 0 of 2 holds 4 layers × 4 linears; 8 micro-batches; 2 iterations; backward = dgrad + wgrad kernels
    assert (gemm["pass"] == "fwd").sum() == 4 * 4 * 8 * 2
    assert (gemm["pass"] == "bwd").sum() == 2 * 4 * 4 * 8 * 2
    qkv = gemm[(gemm["pass"] == "fwd") & (gemm["n"] == 3 * 1024 / 2)]
    assert set(qkv["m"]) == {1024 * 2} and set(qkv["k"]) == {1024}  # [l·b, h] × [h, 3h/tp]
    ar = rank0[rank0["primitive"] == "all_reduce"]
    tp, barrier = ar[ar["group_size"] == 2], ar[ar["group_size"] == 4]
    assert len(tp) + len(barrier) == len(ar)
    assert set(tp["bytes"]) >= {1024 * 2 * 1024 * 2}  # TP all-reduce of one [l, b, h] fp16 activation
    # the logging barrier over the 4 ranks, one value, once per iteration drawn (no loss report: data parallelism 1)
    assert len(barrier) == 2 and set(barrier["bytes"]) == {4}


def test_cluster_file_and_unknown_calibration(tmp_path):
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text("preset: perlmutter\nhardware: NVIDIA A100-SXM4-80GB\n")
    by_file = run("--megatron-args", ARGS, "--cluster", str(cluster), "--json")
    by_flags = run("--megatron-args", ARGS, "--hardware", "A100-SXM4-80GB", "--gpus-per-node", "4", "--json")
    assert by_file.exit_code == 0, by_file.output
    a, b = json.loads(by_file.stdout), json.loads(by_flags.stdout)
    assert a["gpus_per_node"] == 4 and a["hardware"] == "A100-SXM4-80GB"
    assert a["iteration_time_s"] == b["iteration_time_s"]
    res = run("--megatron-args", ARGS, "--hardware", "A100-SXM4-80GB", "--calibration", "no-such-calibration")
    assert res.exit_code == 2 and "no such calibration" in res.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text("hardware: A100\nnic: 400\n")
    res = run("--megatron-args", ARGS, "--cluster", str(bad))
    assert res.exit_code == 2 and "bad.yaml" in res.stderr and "nic" in res.stderr
    res = run("--megatron-args", ARGS, "--cluster", "selenne")
    assert res.exit_code == 2 and "did you mean 'selene'" in res.stderr


def test_defaults_predict_measured_runs_no_constant_was_fitted_on(tmp_path):
    # `predict --batch FILE` with no other flag on measured runs whose rows fitted nothing: the vTrain multi-node
    # runs (64-512 A100; the stack's host constants were fitted on the single-node set) and Narayanan 2021's
    # Selene runs (32-3,072 A100; another stack and era). Stack, hardware and cluster come from each row.
    for name, limit, stack, cluster in (
            ("vtrain_a100_multi_node.csv", 0.12, "megatron-deepspeed-2023", "dgx-a100+stated-network"),
            ("narayanan2021_table1_a100_selene.csv", 0.07, "megatron-lm-2021", "selene")):
        out = tmp_path / f"out-{name}"
        res = run("--batch", str(E2E / name), "--csv-out", str(out), "--json")
        assert res.exit_code == 0, res.output
        with open(out, newline="") as fh:
            got = list(csv.DictReader(fh))
        assert {g["stack"] for g in got} == {stack} and {g["cluster"] for g in got} == {cluster}
        errors = [abs(float(g["predicted_iteration_time_s"]) - float(g["iteration_time_s"]))
                  / float(g["iteration_time_s"]) for g in got]
        assert sum(errors) / len(errors) < limit, (name, sum(errors) / len(errors))
        if name.startswith("narayanan"):  # Table 1 states no micro-batch: the fastest that fits, said per row
            assert all("micro_batch_size not stated: the fastest" in g["prediction_notes"] for g in got)
            assert all(re.search(r"micro_batch_size not stated: (1|2|4|8|16) taken", g["warnings"]) for g in got)
            assert all(g["notes"].startswith("Measured") for g in got)  # the file's own notes column, untouched


def test_overlap_as_megatron_does_it(models):
    from tracekit.core.cluster import preset

    base = dict(num_layers=8, hidden_size=4096, num_attention_heads=32, seq_length=2048, micro_batch_size=1,
                global_batch_size=64, tensor_model_parallel_size=4, pipeline_model_parallel_size=4,
                data_parallel_size=2, precision="bf16", sequence_parallel=True)
    cluster = preset("dgx-a100")

    def run_with(**kw):
        return predict(TrainingConfig(**base, **kw), cluster, models)

    # interleaved schedule: P2P beside the next task (Megatron-core's default) beats blocking sends
    blocking = run_with(virtual_pipeline_model_parallel_size=2, overlap_p2p_comm=False)
    overlapped = run_with(virtual_pipeline_model_parallel_size=2, overlap_p2p_comm=True)
    assert overlapped.iteration_time_s < blocking.iteration_time_s
    assert overlapped.breakdown["exposed_communication"] < blocking.breakdown["exposed_communication"]
    # 1F1B sends are batched and blocking in Megatron whatever the flag
    assert run_with(overlap_p2p_comm=True).iteration_time_s == run_with(overlap_p2p_comm=False).iteration_time_s
    # TE's TP overlap hides the TP collectives under the layer's GEMMs (needs sequence parallelism)
    plain, tp_overlap = run_with(), run_with(tp_comm_overlap=True)
    assert tp_overlap.breakdown["exposed_communication"] < plain.breakdown["exposed_communication"]
    assert tp_overlap.breakdown["compute"] == pytest.approx(plain.breakdown["compute"], rel=1e-12)
    no_sp = dict(base, sequence_parallel=False)
    assert predict(TrainingConfig(**no_sp, tp_comm_overlap=True), cluster, models).iteration_time_s == \
        predict(TrainingConfig(**no_sp), cluster, models).iteration_time_s
    # gradient reduce overlapped with the backward, as --overlap-grad-reduce asks: Megatron cuts buckets on the first
    # pipeline stage only (the others reduce their whole buffer after their last backward, off the critical path)
    overlap_grad = run_with(overlap_grad_reduce=True)
    assert overlap_grad.iteration_time_s < plain.iteration_time_s
    first, last = overlap_grad.timeline.tails[0], overlap_grad.timeline.tails[-1]
    assert first.exposed_sync_us < plain.timeline.tails[0].exposed_sync_us
    assert last.exposed_sync_us == pytest.approx(plain.timeline.tails[-1].exposed_sync_us)


def test_collectives_use_learned_models_only_on_their_cluster(models):
    from tracekit.core.cluster import preset

    # TP all-reduce of [2048, 2, 8192] fp16 = 64 MiB: inside the 42 MB-2.4 GB the Perlmutter samples cover
    cfg = TrainingConfig(num_layers=4, hidden_size=8192, num_attention_heads=64, seq_length=2048, micro_batch_size=2,
                         global_batch_size=8, tensor_model_parallel_size=2, pipeline_model_parallel_size=2,
                         data_parallel_size=2, precision="fp16")
    from predictor.predict import prepare_many

    def path_of_tp_all_reduce(cluster) -> str:
        graph, est, _, _ = prepare_many([cfg], cluster, models)[0]
        return next(est.path[i] for i, spec in enumerate(graph.specs)
                    if spec["primitive"] == "all_reduce" and spec["bytes"] == 2048 * 2 * 8192 * 2)

    # the bundled A100 collectives were sampled on Perlmutter (index: A100-SXM4-80GB=perlmutter), a 2-GPU group
    # inside a node among them: there the learned all-reduce answers; on Selene (not sampled) the physics does
    assert models.sampled_cluster("A100-SXM4-80GB") == "perlmutter"
    assert path_of_tp_all_reduce(preset("perlmutter")) == "model"
    assert path_of_tp_all_reduce(preset("selene")) == "physics"


@pytest.mark.parametrize("cluster_name", ["perlmutter", "selene"])
def test_every_estimate_grows_with_its_work_far_past_the_trained_ranges(models, cluster_name):
    # hidden 1k → 64k (the samples stop at 8-16k), micro-batch and sequence growing too: every operator of the
    # graph — compute and communication, learned (anchored beyond the sampled message sizes on Perlmutter) or
    # physics (Selene) — must take longer for more work, never flatten or drop
    from predictor.predict import prepare_many
    from tracekit.core.cluster import preset

    def per_op(graph, est) -> dict[str, float]:
        out = {}
        for seg in graph.segments:
            for op in seg.fwd + seg.bwd:
                out[f"{op.name}/{graph.specs[op.spec]['pass']}/{op.recompute}"] = float(est.duration_us[op.spec])
        for stage, ops in graph.grad_sync.items():  # fixed-size buckets: their total grows, not each one
            out[f"grad_sync/{stage}"] = float(sum(est.duration_us[op.spec] for op in ops))
        if graph.p2p is not None:
            out["p2p"] = float(est.duration_us[graph.p2p])
        return out

    # the fused masked softmax takes at most 4096 keys (tracekit.core.layer_impl): the unfused series runs PyTorch's
    # softmax chain at every size (--no-masked-softmax-fusion), so that each of its operators is there in all four
    for sp in (False, True):
        configs = [TrainingConfig(num_layers=4, hidden_size=h, num_attention_heads=h // 128, seq_length=s,
                                  micro_batch_size=b, global_batch_size=4 * b, tensor_model_parallel_size=2,
                                  pipeline_model_parallel_size=2, data_parallel_size=2, precision="fp16",
                                  sequence_parallel=sp, attention=attention,
                                  extra={} if attention == "flash" else {"masked_softmax_fusion": False})
                   for attention in ("flash", "unfused")
                   for h, s, b in ((1024, 1024, 1), (4096, 2048, 2), (16384, 4096, 4), (65536, 8192, 8))]
        prepared = prepare_many(configs, preset(cluster_name), models)
        for start in (0, 4):
            series = [per_op(*prepared[start + i][:2]) for i in range(4)]
            for name in series[0]:
                values = [s[name] for s in series if name in s]
                assert len(values) == 4 and all(b > a for a, b in zip(values, values[1:])), (name, values)


def test_gradients_in_fp32_double_the_data_parallel_traffic(models):
    """fp32 gradients double what data parallelism moves; fp16 gradients take less memory only until the fp16
    optimizer gives its fp32 main parameters fp32 copies of them (2 + 4 bytes a parameter against 4)."""
    from predictor.assembly.graph import build_graph
    from predictor.memory.stages import memory_per_gpu

    base = dict(num_layers=4, hidden_size=1024, num_attention_heads=16, seq_length=1024, global_batch_size=8,
                data_parallel_size=2, precision="fp16")
    fp16, fp32 = (build_graph(TrainingConfig(**base, accumulate_allreduce_grads_in_fp32=flag), "A100-SXM4-80GB")
                  for flag in (False, True))
    dp_bytes = [sum(g.specs[op.spec]["bytes"] for op in g.grad_sync[0]) for g in (fp16, fp32)]
    assert dp_bytes[1] == 2 * dp_bytes[0]
    assert memory_per_gpu(fp16)[0]["gradients"] == pytest.approx(1.5 * memory_per_gpu(fp32)[0]["gradients"])
    assert TrainingConfig(**dict(base, precision="bf16")).grad_bytes == 4  # Megatron forces it with bf16


def test_misspelt_settings_are_refused_with_a_suggestion(tmp_path):
    res = run("--megatron-args", ARGS + " --sequence-paralel", "--hardware", "A100-SXM4-80GB")
    assert res.exit_code == 2 and "did you mean 'sequence_parallel'" in res.stderr
    res = run("--megatron-args", ARGS, "--hardware", "A100-SXM4-80GB", "--set", "atention=unfused")
    assert res.exit_code == 2 and "--set: unknown setting 'atention' (did you mean 'attention'?)" in res.stderr
    res = run("--megatron-args", ARGS, "--hardware", "A100-SXM4-80GB", "--set", "colour=blue")
    assert res.exit_code == 2 and "unknown setting 'colour'" in res.stderr
    job = tmp_path / "job.yaml"
    job.write_text("num_layers: 4\nhidden_size: 1024\nnum_attention_heads: 16\nseq_length: 1024\nmicro_bach_size: 2\n")
    res = run(str(job), "--hardware", "A100-SXM4-80GB")
    assert res.exit_code == 2 and "job.yaml" in res.stderr and "did you mean 'micro_batch_size'" in res.stderr
    # Megatron's own arguments tracekit does not model stay accepted (kept aside), e.g. the learning rate
    assert run("--megatron-args", ARGS + " --lr 1e-4 --recompute-method uniform", "--hardware",
               "A100-SXM4-80GB").exit_code == 0


def test_diff_of_a_pp4_prediction_keeps_four_stages(tmp_path):
    # predicted traces hold one rank per stage (0, 4, 8, 12 of 16); their P2P names the whole pipeline group, as
    # Megatron's batch_isend_irecv does, so diff finds pp = 4 from the traces alone (it grouped them in 2 stages)
    pred = tmp_path / "pred"
    args = ARGS.replace("--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2",
                        "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 4 --world-size 16")
    assert run("--megatron-args", args, "--hardware", "A100-SXM4-80GB", "--trace-out", str(pred)).exit_code == 0
    done = runner.invoke(app, ["diff", str(pred), str(pred), "--json"])
    assert done.exit_code == 0, done.output
    stages = [(s["stage"], s["ranks"]) for s in json.loads(done.stdout)["by_stage"]]
    assert stages == [(0, [0]), (1, [4]), (2, [8]), (3, [12])]


def test_gpus_flag_sets_the_world_and_dp_follows():
    doc = json.loads(run("--megatron-args", ARGS, "--hardware", "A100-SXM4-80GB", "--gpus", "16", "--json").stdout)
    assert doc["world_size"] == 16 and doc["config"]["data_parallel_size"] == 16 // (2 * 2) and doc["nodes"] == 2
    res = run("--megatron-args", ARGS, "--hardware", "A100-SXM4-80GB", "--gpus", "6")
    assert res.exit_code == 2 and "world size 6 is not divisible by tp·pp·cp = 4" in res.stderr


def test_short_help_and_version():
    helped = runner.invoke(app, ["-h"])
    assert helped.exit_code == 0 and "Usage" in helped.stdout and "search" in helped.stdout
    assert runner.invoke(app, ["predict", "-h"]).exit_code == 0
    version = runner.invoke(app, ["--version"])
    assert version.exit_code == 0 and version.stdout.startswith("tracekit ")


def test_unknown_megatron_flags_need_allow_unknown_and_then_warn():
    res = run("--megatron-args", ARGS + " --zebra-mode 3", "--hardware", "A100-SXM4-80GB")
    assert res.exit_code == 2 and "unknown setting 'zebra_mode'" in res.stderr and "--allow-unknown" in res.stderr
    res = run("--megatron-args", ARGS + " --zebra-mode 3", "--hardware", "A100-SXM4-80GB", "--allow-unknown",
              "--json")
    assert res.exit_code == 0 and "'zebra_mode' is not a flag of Megatron-LM" in res.stdout  # JSON warnings list
