"""What torch.compile changes in a prediction (predictor.layers.compile_fusion), side by side with the eager one:
torchtitan's Llama 3 presets (tests/data/jobs) on A100 and H100 with `[compile] enable` off and on — the layer's
memory-bound kernels and their bytes per layer, forward and backward, and the iteration time with the torchtitan stack.
No torchtitan measurement is in the corpus, so these are the model's ratios, not accuracy figures; the llm-foundry rows'
what-if (every row compiled) is printed by `benchmarks/e2e_accuracy.py --only llm-foundry`.

    .venv/bin/python benchmarks/compile_fusion.py        # ~30 s
"""
from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from extractors.jobs.torchtitan import read_torchtitan  # noqa: E402
from predictor.assembly.graph import build_graph  # noqa: E402
from predictor.costs.features import compute_work  # noqa: E402
from predictor.costs.learned.models import ModelSet  # noqa: E402
from predictor.layers.compile_fusion import FUSED_PRIMITIVES  # noqa: E402
from predictor.predict import predict  # noqa: E402
from tracekit.core.cluster import Cluster  # noqa: E402
from tracekit.core.config import TrainingConfig  # noqa: E402
from tracekit.core.runtime import RuntimeSettings  # noqa: E402
from tracekit.core.samples import FSDP_COPIES  # noqa: E402
from tracekit.core.stacks import get_stack  # noqa: E402

JOBS = ROOT / "tests" / "data" / "jobs"
RUNS = (("llama3_8b.toml", 8), ("llama3_70b.toml", 64))
HARDWARE = ("A100-SXM4-80GB", "H100-80GB-HBM3")


def layer_kernels(c: TrainingConfig, hardware: str) -> tuple[int, int, float]:
    """Memory-bound kernels of one layer forward and backward (replays left out), and the GB they move."""
    g = build_graph(c, hardware)
    seg = g.segment(0, 0)
    counts, moved = [], 0.0
    for ops in (seg.fwd, seg.bwd):
        rows = [o for o in ops if o.per_layer and not o.recompute  # FSDP's copies run outside the compiled block
                and g.specs[o.spec]["primitive"] in FUSED_PRIMITIVES and g.specs[o.spec]["variant"] not in FSDP_COPIES]
        counts.append(len(rows))
        moved += float(np.sum(compute_work(pd.DataFrame([g.specs[o.spec] for o in rows]))[1]))
    return counts[0], counts[1], moved / 1e9


def main() -> None:
    models = ModelSet.load(None)
    stack = get_stack("torchtitan")
    print(f"{'job':<16} {'GPUs':>4} {'hardware':<16} {'kernels/layer fwd+bwd':>22} {'GB/layer':>13} "
          f"{'eager s':>8} {'compiled s':>10} {'compiled/eager':>14}")
    for job, gpus in RUNS:
        base = TrainingConfig.from_mapping(read_torchtitan(JOBS / job, world_size=gpus).settings,
                                           defaults=stack.config)
        for hardware in HARDWARE:
            configs = [dataclasses.replace(base, run=RuntimeSettings(torch_compile=on)) for on in (False, True)]
            (ef, eb, eg), (cf, cb, cg) = (layer_kernels(c, hardware) for c in configs)
            cluster = Cluster(hardware, gpus_per_node=8)
            eager, fused = (predict(c, cluster, models, stack.calibration(hardware)).iteration_time_s
                            for c in configs)
            print(f"{job:<16} {gpus:>4} {hardware:<16} {f'{ef}+{eb} → {cf}+{cb}':>22} {f'{eg:.2f} → {cg:.2f}':>13} "
                  f"{eager:>8.3f} {fused:>10.3f} {fused / eager:>14.3f}")


if __name__ == "__main__":
    main()
