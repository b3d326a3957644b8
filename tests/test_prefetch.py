"""Background reading of a workload's own dataset (convergence.loader_workers): the batches are
the trial's, step for step, whoever reads them; each item's random draws depend only on the
trial's seed, the step and the item's place in the global batch."""

from __future__ import annotations

from pathlib import Path

import torch

from batchscale.config import parse_config
from batchscale.contract_check import load_split
from batchscale.convergence import runner, train
from batchscale.convergence.distributed import Dist
from batchscale.datasplit import _SeededSteps
from batchscale.location import LocalLocation
from batchscale.workloads import get_workload


def test_an_item_draws_the_same_noise_whichever_rank_reads_it():
    from contract_workloads import augmented

    reader = _SeededSteps(load_split(augmented, "train"), seed=3)
    step, (whole,) = reader[(5, [(0, [1, 2, 3, 4])])]
    _, (rank0,) = reader[(5, [(0, [1, 2])])]
    _, (rank1,) = reader[(5, [(2, [3, 4])])]
    assert step == 5 and torch.equal(whole[0], torch.cat([rank0[0], rank1[0]]))
    _, (other_step,) = reader[(6, [(0, [1, 2, 3, 4])])]
    assert not torch.equal(whole[0], other_step[0])  # fresh noise each step


def curve(tmp: Path, workload_name: str, loader_workers: int, pause_at: int | None = None,
          data_dir: str = "unused"):
    """One in-process trial of `workload_name` (optionally paused at a step and resumed by a
    new Trial from its checkpoint, as successive halving does): its curve."""
    cfg = parse_config({"workload": workload_name, "convergence": {
        "batch_sizes": [16], "lr_rules": ["sqrt"], "seeds": [0], "max_steps": 40,
        "targets": [{"metric": "val_accuracy", "value": 1.0}], "eval_every_steps": 10,
        "checkpoint_every_steps": 10, "loader_workers": loader_workers}})
    spec = runner.build_spec(cfg, [16], data_dir=data_dir, out_dir=str(tmp), run_id="pf")
    workload = get_workload(workload_name)
    data = train.load_data(data_dir, workload)
    checkpoints = LocalLocation(tmp / "ckpt")

    def trial() -> train.Trial:
        return train.Trial(spec, spec.trials[0], data, Dist(0, 1, "cpu"), checkpoints, workload)

    first = trial()
    if pause_at is not None:
        assert first.run(pause_at_step=pause_at) is None
        first = trial()
    first.run()
    return [(row["step"], row["train_loss"], row["val_accuracy"]) for row in first.state.curve]


def test_background_reading_trains_on_the_same_batches(tmp_path, monkeypatch):
    """Without random draws in __getitem__, 2 loader workers give the in-process curve."""
    monkeypatch.chdir(Path(__file__).parent)
    assert (curve(tmp_path / "a", "contract_workloads:good", 2)
            == curve(tmp_path / "b", "contract_workloads:good", 0))


def test_augmented_batches_repeat_after_a_resume(tmp_path, monkeypatch):
    """With random augmentation, a trial paused at step 20 and resumed by a new Trial (new
    loader workers, starting at step 20) has the uninterrupted trial's curve."""
    monkeypatch.chdir(Path(__file__).parent)
    plain = curve(tmp_path / "a", "contract_workloads:augmented", 2)
    resumed = curve(tmp_path / "b", "contract_workloads:augmented", 2, pause_at=20)
    assert [row[0] for row in plain] == [0, 10, 20, 30, 40]
    assert resumed == plain


def test_a_builtin_workloads_prepared_rows_read_in_the_background_give_the_same_curve(tmp_path):
    """The built-ins are contract workloads: their prepared rows, read by loader workers through
    the batched __getitems__, train exactly as when read in the step."""
    from batchscale.config import DataPrepConfig
    from batchscale.data.prep import prepare

    prepare(DataPrepConfig(), tmp_path / "digits")
    data = str(tmp_path / "digits")
    assert (curve(tmp_path / "a", "digits-mlp", 2, data_dir=data)
            == curve(tmp_path / "b", "digits-mlp", 0, data_dir=data))
