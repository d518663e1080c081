"""What docs/pytorch.md says cannot run as the guides print it, checked against the guides' programs
(read from ``../shared/guides/pytorch``) and the Ray and emulator code they would meet, and the
``ScalingConfig`` tpufleet gives a TorchTrainer instead. What does run unchanged is run by
tests/integration/test_torch_jobs.py. (Here, not in tests/unit: Ray Train's modules are imported.)"""

from __future__ import annotations

import ast
import builtins
from pathlib import Path

import pytest

from tpufleet import catalog, contract, runtime
from tpufleet.emulator import plan

GUIDES = Path(__file__).parents[3] / "shared" / "guides" / "pytorch"


def _tree(name: str) -> ast.Module:
    return ast.parse((GUIDES / name).read_text())


def _undefined(tree: ast.Module) -> set[str]:
    """Names the program reads that it never imports, defines or assigns (nor are built in)."""
    bound = set(dir(builtins))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            bound |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, ast.FunctionDef | ast.ClassDef):
            bound.add(node.name)
            bound |= {a.arg for a in node.args.args} if isinstance(node, ast.FunctionDef) else set()
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            bound.add(node.id)
    read = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    return read - bound


def _scaling_config_call(tree: ast.Module) -> ast.Call:
    (call,) = [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "ScalingConfig"
    ]
    return call


def test_the_torchtrainer_guide_reads_two_names_it_never_defines() -> None:
    assert _undefined(_tree("torchtrainer_tpu.py")) == {"ScalingConfig", "your_dataset_here"}
    assert _undefined(_tree("tpu_training.py")) == set()
    assert _undefined(_tree("single_host_check.py")) == set()


def test_ray_train_refuses_the_torchtrainer_guides_scaling_config() -> None:
    from ray.train import ScalingConfig

    call = _scaling_config_call(_tree("torchtrainer_tpu.py"))
    kwargs = {k.arg: ast.literal_eval(k.value) for k in call.keywords if k.arg}
    assert kwargs == {"num_workers": 4, "use_gpu": False, "resources_per_worker": {"TPU": 1}}
    with pytest.raises(ValueError, match="`use_tpu` is False but `TPU` was found"):
        ScalingConfig(**kwargs)


def test_ray_train_picks_torchtpus_backend_for_a_torchtrainer_on_tpus() -> None:
    from ray.train import ScalingConfig
    from ray.train.torch import TorchTrainer

    scaling = ScalingConfig(use_tpu=True, num_workers=2, topology="2x2x2", accelerator_type="TPU-V4")
    trainer = TorchTrainer(lambda: None, scaling_config=scaling)
    assert trainer.backend_config.backend == "tpu_dist"  # TorchTPU's (torch_tpu), not PyTorch/XLA's
    assert scaling.resources_per_worker["TPU"] == 4  # one worker per host, all of its chips


def test_the_xmp_guides_tasks_ask_for_a_resource_no_ray_node_has() -> None:
    (decorator,) = [
        d
        for n in ast.walk(_tree("tpu_training.py"))
        if isinstance(n, ast.FunctionDef)
        for d in n.decorator_list
        if isinstance(d, ast.Call)
    ]
    resources = ast.literal_eval(next(k.value for k in decorator.keywords if k.arg == "resources"))
    assert resources == {"google.com/tpu": 1}  # GKE's name for a chip, in a Pod's limits
    argv = plan.host_argv("ray", "127.0.0.1", "127.0.0.1:1", catalog.slice_type("v4-16"), 1, "/t", 1, False)
    assert ast.literal_eval(argv[argv.index("--resources") + 1]) == {"TPU": 4}  # what a host offers


def test_a_torchtrainer_gets_one_worker_per_admitted_host_placed_by_its_labels_and_no_tpu() -> None:
    st = catalog.slice_type("v4-16")
    env = contract.ray_driver_env("j1", 1, "/ckpt/a/j1", [("tpu-v4-16-1", st), ("tpu-v4-16-0", st)])
    scaling = runtime.torch_scaling_config(env)
    assert scaling.num_workers == 4 and not scaling.use_tpu
    assert scaling.label_selector == [  # rank r on host r, slices in the order admitted
        {"ray.io/tpu-slice-name": name, "ray.io/tpu-worker-id": worker}
        for name in ("tpu-v4-16-1", "tpu-v4-16-0")
        for worker in ("0", "1")
    ]
    assert "TPU" not in scaling._resources_per_worker_not_none  # Ray's TPU device manager needs torch_tpu
