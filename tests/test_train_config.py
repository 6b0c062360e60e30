"""The trainer's frozen config: merging flags, recipe and dataset defaults, and a resumed run's saved settings."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from lkat_lens import train as lktrain
from lkat_lens.distributed import DistInfo
from lkat_lens.train_config import TrainConfig, UsageError, resolve_config


def parse(*argv: str):
    return lktrain.build_parser().parse_args(list(argv))


def test_config_is_frozen_and_typed():
    cfg = resolve_config(parse())
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.lr = 1.0  # type: ignore[misc]
    assert isinstance(cfg.epochs, int) and isinstance(cfg.lr, float)


def test_every_flag_is_a_config_field_with_the_same_default():
    parser = lktrain.build_parser()
    names = {f.name: f.default for f in dataclasses.fields(TrainConfig)}
    for action in parser._actions:
        if action.dest == "help":
            continue
        assert action.dest in names, action.dest
        assert action.default == names[action.dest], action.dest


def test_flags_beat_the_recipe_and_the_recipe_beats_the_dataset():
    cfg = resolve_config(parse("--lr", "0.5", "--recipe", "plain"))
    assert (cfg.lr, cfg.batch_size, cfg.recipe, cfg.model) == (0.5, 256, "plain", "lkat_micro")


def test_resume_keeps_saved_settings_but_takes_this_invocations_and_given_machine_flags():
    saved = resolve_config(parse("--epochs", "7", "--workers", "3", "--data-dir", "/x")).to_dict()
    saved["from_a_future_version"] = 1  # unknown keys are dropped
    del saved["clip_grad"]  # an older checkpoint without a newer field gets its default
    cfg = resolve_config(parse("--epochs", "9", "--threads", "2", "--data-dir", "/y"), saved=saved)
    assert (cfg.epochs, cfg.threads, cfg.workers, cfg.data_dir, cfg.clip_grad) == (7, 2, 3, "/y", None)
    resumed = resolve_config(parse("--compile", "--activation-memory-budget", "0.5"), saved=saved)
    assert (resumed.compile, resumed.activation_memory_budget) == (True, 0.5)
    with pytest.raises(UsageError, match="needs --compile"):  # this invocation's flags are checked on resume too
        resolve_config(parse("--activation-memory-budget", "0.5"), saved=saved)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--epochs", "0"], "--epochs is out of range: 0"),
        (["--drop", "1.5"], "--drop must lie in [0, 1)"),
        (["--attn-drop", "-0.1"], "--attn-drop must lie in [0, 1)"),
        (["--warmup-epochs", "-1"], "--warmup-epochs is out of range: -1"),
        (["--compile-mode", "reduce-overhead"], "--compile-mode reduce-overhead needs --compile"),
        (["--activation-memory-budget", "0.5"], "--activation-memory-budget 0.5 needs --compile"),
        (["--compile", "--activation-memory-budget", "0"], "--activation-memory-budget must lie in (0, 1]: 0.0"),
        (["--compile", "--activation-memory-budget", "1.5"], "--activation-memory-budget must lie in (0, 1]: 1.5"),
        (["--compile", "--eager-graphs"], "--eager-graphs replays the eager steps' kernels as CUDA graphs"),
    ],
)
def test_out_of_range_values_are_user_errors(argv, message):
    with pytest.raises(UsageError, match=message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        resolve_config(parse(*argv))


def test_cuda_runs_take_tf32_and_the_backward_on_the_training_thread():
    """The process settings of a CUDA run (settable without a GPU): TF32 beside bf16 autocast and autograd's backward
    on the calling thread; a CPU run keeps the engine's default threads."""
    before = (torch.get_num_threads(), torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    cfg = resolve_config(parse())
    try:
        assert lktrain.apply_process_settings(cfg, DistInfo(0, 1, 0, torch.device("cpu"))) is None
        assert torch._C._is_multithreading_enabled()
        assert lktrain.apply_process_settings(cfg, DistInfo(0, 1, 0, torch.device("cuda"))) == torch.bfloat16
        assert not torch._C._is_multithreading_enabled()
        assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
    finally:
        torch.autograd.set_multithreading_enabled(True)
        torch.set_num_threads(before[0])
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before[1:]


# the trainer's compile settings: words, whether the mode replays CUDA graphs, whether the run trains through flats
COMPILE_CASES = [
    ([], False, False),
    (["--compile"], False, True),
    (["--compile", "--compile-mode", "reduce-overhead"], True, False),
    (["--compile", "--compile-mode", "max-autotune"], True, False),
    (["--compile", "--compile-mode", "max-autotune-no-cudagraphs"], False, True),
]


@pytest.mark.parametrize(("argv", "graphs", "flat"), COMPILE_CASES)
def test_a_compile_mode_with_cuda_graphs_sets_lkat_for_them(argv, graphs, flat):
    """torch.compile's modes that replay CUDA graphs set the model's GLA layers for them (VisionGLA.cuda_graphs: the
    core keeps its short kernels as ops); the others, and no compile, leave them as they are."""
    import lkat_lens
    from lkat_lens.models.attention import VisionGLA

    model = lkat_lens.create_model("lkat_micro", num_classes=10)
    lktrain.wrap_model(model, resolve_config(parse(*argv)), DistInfo(0, 1, 0, torch.device("cpu")))
    layers = [m for m in model.modules() if isinstance(m, VisionGLA)]
    assert layers and all(layer.cuda_graphs is graphs for layer in layers)


@pytest.mark.parametrize("argv", [[], ["--eager-graphs"]])
def test_eager_graphs_set_lkats_gla_cores_and_kan_mlps(argv):
    """--eager-graphs sets every GLA layer and KAN MLP to replay its kernels as CUDA graphs (on CUDA; eager_graphs),
    and a run without it leaves them launching their kernels, the models' default."""
    import lkat_lens
    from lkat_lens.models.attention import VisionGLA
    from lkat_lens.models.kan import KAN

    model = lkat_lens.create_model("lkat_micro", num_classes=10)
    lktrain.wrap_model(model, resolve_config(parse(*argv)), DistInfo(0, 1, 0, torch.device("cpu")))
    layers = [m for m in model.modules() if isinstance(m, VisionGLA | KAN)]
    assert len(layers) == 2 * len(model.blocks) and all(layer.eager_graphs is bool(argv) for layer in layers)


@pytest.mark.parametrize(("argv", "graphs", "flat"), COMPILE_CASES)
def test_compiled_runs_without_cuda_graphs_train_through_flat_parameters(argv, graphs, flat):
    """The modes whose steps are bound by the host (compiled, no CUDA graphs) flatten the parameters; eager runs and
    CUDA graphs keep them as they are (lkat_lens.flat_params; tests/test_flat_params.py trains through them)."""
    assert lktrain.flattens_parameters(resolve_config(parse(*argv))) is flat
