"""The emulator's fidelity, reduced form (``experiments/fidelity.py``; the full table is
``bench/emulation_fidelity.py``): on BERT, two ``instrumented`` runs -> ``profile fit`` -> one
``original`` and one ``sleep`` run with that profile, caches dropped before each.

- Against the real runs: the emulated median step and epoch time lie within the three real
  runs' range widened by twice the goals (4 %, 10 %); overall >= 0.90, CPU cost <= 0.30. A
  single pair's error is not asserted: on the 2-core build machines the same real run varies
  by up to 36 % minutes apart (BERT's original median step, 0.53-0.72 s in four alternated
  runs), and an emulated run draws its steps from the real runs' distribution, so a pair's
  error carries both; the range is what the real job itself shows.
- Against the runs its profile was fitted to, and against itself, whatever the host's speed:
  the emulated median step within twice the step goal of the instrumented runs' and of the
  median step it requested (BERT's loader keeps ahead of the compute: what remains is taking
  the batch and the emulator's own overhead), the emulated compute within 5 ms of what was
  requested per step, and the real runs must show what the comparison relies on: what
  computed the steps, and the loader workers' CPU.

A measurement during which the machine stalled is made again (``ATTEMPTS``)."""

from __future__ import annotations

import json

import pytest

from analysis.fidelity import GOALS
from experiments.fidelity import measure_workload
from store.rundir import load_run

pytestmark = [pytest.mark.integration, pytest.mark.docker, pytest.mark.bpftrace]


#: Measurements made while the machine stalled (other virtual machines on the host can stop
#: this one's cores for seconds: BERT steps of 0.5 s took 3 s) say nothing about the emulator:
#: the measurement is made again, at most this many times in all.
ATTEMPTS = 2


def stalled(result: dict) -> bool:
    """The profile fit found stalled steps, or the real runs' median steps spread by more
    than half."""
    return result["step_noise"] > 0.5 or any("stalled" in w for w in result["fit_warnings"])


@pytest.fixture(scope="module")
def bert_fidelity(images, tmp_path_factory: pytest.TempPathFactory) -> dict:
    for attempt in range(1, ATTEMPTS + 1):
        root = tmp_path_factory.mktemp("fidelity")
        lines: list[str] = []
        result = measure_workload("bert", 1, root, root / "runs", lines.append)
        print("\n".join(lines))
        if not stalled(result):
            return result
        print(f"attempt {attempt} of {ATTEMPTS}: the machine stalled during the measurement")
    pytest.fail(f"the machine stalled in all {ATTEMPTS} attempts: the emulator was not measured")


def test_bert_emulation_is_within_twice_the_goals(bert_fidelity: dict) -> None:
    (pair,) = bert_fidelity["pairs"]
    keys = (*GOALS, "closest_overall", "own_step_error", "fit_step_error", "lowest", "late_ms")
    noise = ("step_noise", "epoch_noise", "real_steps_s", "real_epochs_s", "overall_noise")
    print(json.dumps({**{k: pair[k] for k in keys}, **{k: bert_fidelity[k] for k in noise}}))
    for emulated, real, goal in (
        (pair["emulated_step_s"], bert_fidelity["real_steps_s"], GOALS["step_error"]),
        (pair["emulated_epoch_s"], bert_fidelity["real_epochs_s"], GOALS["epoch_error"]),
    ):
        assert min(real) * (1 - 2 * goal) <= emulated <= max(real) * (1 + 2 * goal)
    assert abs(pair["own_step_error"]) <= 2 * GOALS["step_error"]
    assert abs(pair["fit_step_error"]) <= 2 * GOALS["step_error"]
    # Against the real run closest to it, within 0.05 of twice the goal, or of the real job
    # against its own rerun where that is lower: the analyzer sees rates (the host drifts by
    # up to 25 % between runs: the real median steps of one measurement were 0.53, 0.69 and
    # 0.70 s, the emulated 0.70 s scored 0.823 against the 0.53 s run) and its harmonic
    # overall weighs the cache-dependent block lane of a 1 MB dataset. An emulation of
    # another CPU, or at twice the rate, scores 0.77-0.78 against the real runs
    # (docs/similarity.md).
    floor = min(1 - 2 * (1 - GOALS["overall"]), bert_fidelity["overall_noise"]) - 0.05
    assert pair["closest_overall"] >= floor
    assert pair["cost"] <= 2 * GOALS["cost"]
    assert 0 <= pair["late_ms"] < 5
    assert pair["busy_s"] == pytest.approx(pair["requested_s"], rel=0.02)


def test_the_runs_say_what_computed_and_what_the_loaders_used(bert_fidelity: dict) -> None:
    from analysis.similarity import compare_runs
    from analysis.similarity.profile import run_profile

    real, emulated = (load_run(p) for p in bert_fidelity["pairs"][0]["runs"])
    assert run_profile(real).accelerators == ("cpu",)
    (label,) = run_profile(emulated).accelerators
    assert label.startswith("emulated: ")
    phases = emulated.phases
    assert (phases["key"] == "framework_warmup").sum() == 1
    for run in (real, emulated):
        loader = run.samples[run.samples["metric"] == "container_cpu_loader"]["value"]
        whole = run.samples[run.samples["metric"] == "container_cpu"]["value"]
        assert len(loader) == len(whole) > 10
        assert loader.mean() > 0 and loader.mean() <= whole.mean() + 1e-9
    cpu = next(a for a in compare_runs(real, emulated).aspects if a.name == "cpu")
    assert cpu.details["compared"].startswith("the data-loader workers' CPU")
    assert cpu.details["container_cpu_score"] < cpu.score
