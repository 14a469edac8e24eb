"""``profile fit`` on instrumented runs with known phase times (analysis/profiles.py): the
compute table, the phase split and the first step's one-off warm-up."""

from __future__ import annotations

from pathlib import Path

import pytest

from analysis.profiles import fit_runs
from store.rundir import load_run
from tests import synthetic


def instrumented_run(root: Path, run_id: str, first: float, steps: int = 12) -> Path:
    """One epoch of ``steps`` steps: forward 0.1 s, loss 0.02, backward 0.14, optimizer 0.04
    (all_compute 0.3 s), except the first step, whose all_compute takes ``first`` s."""
    rows = []
    t = 1.0
    for step in range(steps):
        compute = first if step == 0 else 0.3
        key = {"epoch": 1, "step": step, "rank": 0}
        rows += [
            {"key": "load_batch_mem", "t0": t, "t1": t + 0.01, **key},
            {"key": "all_compute", "t0": t + 0.01, "t1": t + 0.01 + compute, **key},
            {"key": "model_forward_pass", "t0": t + 0.01, "t1": t + 0.11, **key},
            {"key": "loss_tensor_calc", "t0": t + 0.11, "t1": t + 0.13, **key},
            {"key": "model_backward_pass", "t0": t + 0.13, "t1": t + 0.27, **key},
            {"key": "model_optim_step", "t0": t + 0.27, "t1": t + 0.31, **key},
            {"key": "step_end", "t0": t + 0.02 + compute, "value": 4, **key},
        ]
        t += 0.02 + compute
    config = {"workload": "bert", "variant": "instrumented", "batch_size": 4, "accelerators": 1}
    return synthetic.make_run(
        root,
        run_id,
        phases=synthetic.phases_frame(rows),
        config=config,
        end_ns=synthetic.START_NS + 100 * synthetic.SEC,
    )


def test_fit_keeps_the_split_and_the_first_steps_warm_up(tmp_path: Path) -> None:
    runs = [
        load_run(instrumented_run(tmp_path, "20261121-163000-bert-instrumented-0001", 0.5)),
        load_run(instrumented_run(tmp_path, "20261121-163100-bert-instrumented-0002", 0.45)),
        load_run(instrumented_run(tmp_path, "20261121-163200-bert-instrumented-0003", 0.2)),
    ]
    profile, _ = fit_runs(runs)
    (point,) = profile.table
    assert (point.g, point.b, point.n) == (1, 4, 33) and point.mean == pytest.approx(0.3)
    assert point.quantiles is not None and point.quantiles[0] == pytest.approx(0.3)
    # warm-up per run: 0.2, 0.15, and 0 (a first step shorter than the rest counts as none)
    assert profile.first_step_s == pytest.approx(0.15)
    split = profile.split
    assert (split.forward, split.backward, split.optimizer) == pytest.approx(
        (0.1 / 0.3, 0.16 / 0.3, 0.04 / 0.3)
    )
