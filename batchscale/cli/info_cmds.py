"""`batchscale workloads`, `datasets` and `config`: what there is to choose from."""

from __future__ import annotations

from batchscale.config import DEFAULT_CONFIG_PATH, reference_markdown


def cmd_workloads(args) -> int:
    from batchscale.metrics import TASK_DEFAULT_TARGETS, target_label
    from batchscale.workloads import WORKLOAD_NAMES, get_workload

    for name in WORKLOAD_NAMES:
        w = get_workload(name)
        target = target_label(*TASK_DEFAULT_TARGETS[w.kind])
        print(f"{name:40s} {w.kind:15s} input {w.input_shape}  {w.description}; default "
              f"target {target}")
    print("package.module:workload                  your own batchscale.Workload (model, data, "
          "loss, metrics, targets: docs/your-model.md)")
    print("package.module:loop                      your own batchscale.TrainingLoop: a "
          "train(trial) function (convergence and analysis only: docs/your-model.md)")
    print("package.module:factory                   your own nn.Module factory, trained as a "
          "classifier on a prepared dataset")
    return 0


def cmd_datasets(args) -> int:
    from batchscale.catalog import DATASETS

    width = max(map(len, DATASETS))
    print("\n".join(f"{name:{width}s}  {about}" for name, about in DATASETS.items()))
    return 0


def cmd_config(args) -> int:
    if args.action == "show":
        print(DEFAULT_CONFIG_PATH.read_text(), end="")
    else:
        print(reference_markdown())
    return 0
