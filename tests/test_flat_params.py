"""lkat_lens.flat_params: a model trained through flat Parameters against the same model trained as it is."""

from __future__ import annotations

import copy

import flat_ddp_worker
import pytest
import torch
import torch.multiprocessing as mp
from local_server import free_port
from timm.models.vision_transformer import VisionTransformer
from tolerance import assert_close

import lkat_lens
from lkat_lens import distributed as lkdist
from lkat_lens import recipe as lkrecipe
from lkat_lens import train as lktrain
from lkat_lens.flat_params import FlatParameters, block_of
from lkat_lens.telemetry_records import read_telemetry

WEIGHT_DECAY = 0.05


def twins() -> tuple[torch.nn.Module, torch.nn.Module, FlatParameters]:
    """lkat_micro, an identical copy, and the copy flattened over timm's weight-decay groups."""
    torch.manual_seed(0)
    model = lkat_lens.create_model("lkat_micro", num_classes=10)
    twin = copy.deepcopy(model)
    return model, twin, FlatParameters(twin, lkrecipe.param_groups(twin, WEIGHT_DECAY))


def batch(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(6, 3, 16, 16, generator=generator), torch.randint(0, 10, (6,), generator=generator)


def adamw(groups) -> torch.optim.Optimizer:
    return lkrecipe.build_optimizer(groups, lkrecipe.DEIT, lr=1e-3, weight_decay=WEIGHT_DECAY)


def loss_of(net: torch.nn.Module, seed: int) -> torch.Tensor:
    x, y = batch(seed)
    return torch.nn.functional.cross_entropy(net(x), y)


def test_one_flat_per_weight_decay_group_and_block_holding_each_parameter_once():
    model, twin, flat = twins()
    groups = lkrecipe.param_groups(model, WEIGHT_DECAY)
    names = {id(p): n for n, p in model.named_parameters()}
    expected = [len({block_of(names[id(p)]) for p in group["params"]}) for group in groups]
    assert [len(group["params"]) for group in flat.param_groups] == expected
    assert [g["weight_decay"] for g in flat.param_groups] == [g["weight_decay"] for g in groups]
    pieces = [piece.name for layout in flat.layouts for piece in layout]
    assert sorted(pieces) == sorted(names.values())
    assert sum(f.numel() for f in flat.flats) == sum(p.numel() for p in model.parameters())
    assert block_of("blocks.3.attn.q_proj.weight") == "blocks.3" and block_of("pos_embed") == ""
    assert not any(p.requires_grad for p in twin.parameters())


def test_forward_and_gradients_are_the_models_own():
    """The flattened forward's logits and each flat's gradient slices against the plain model's autograd."""
    model, twin, flat = twins()
    assert_close(flat(batch()[0]), model(batch()[0]))
    loss_of(model, 1).backward()
    loss_of(flat, 1).backward()
    with flat.gradients_exposed():
        for (name, p), q in zip(model.named_parameters(), twin.parameters(), strict=True):
            assert_close(q.grad, p.grad, msg=name)
    assert all(q.grad is None for q in twin.parameters())


def test_without_gradients_the_model_runs_itself_on_the_flats_values(monkeypatch):
    """No views are built without gradients: the model's own Parameters (aliasing the flats) give its logits, also
    after the flats change in place as an optimizer step changes them."""
    model, _, flat = twins()
    x = batch()[0]
    with torch.no_grad():
        for f in flat.flats:
            f.mul_(0.5)
        for p in model.parameters():
            p.mul_(0.5)
    monkeypatch.setattr(flat, "views", lambda: pytest.fail("views built without gradients"))
    with torch.no_grad():
        assert_close(flat(x), model(x))
    with torch.inference_mode():
        assert_close(flat(x), model(x))


def test_adamw_through_the_flats_trains_the_model_as_it_trains_itself():
    """Three AdamW steps with weight-decay groups: the model's own Parameters (views of the flats, read through
    state_dict) end where the plain model's end, and the flat optimizer's state, unflattened, is the plain one's."""
    model, twin, flat = twins()
    plain_opt = adamw(lkrecipe.param_groups(model, WEIGHT_DECAY))
    flat_opt = adamw(flat.param_groups)
    for seed in range(3):
        for net, opt in ((model, plain_opt), (flat, flat_opt)):
            loss_of(net, seed).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    trained = twin.state_dict()
    for name, value in model.state_dict().items():
        assert_close(trained[name], value, msg=name)
    unflat, plain = flat.unflatten_optimizer_state(flat_opt.state_dict()), plain_opt.state_dict()
    assert unflat["param_groups"] == plain["param_groups"]
    assert unflat["state"].keys() == plain["state"].keys()
    for index, state in plain["state"].items():
        for key, value in state.items():
            assert_close(unflat["state"][index][key], value, msg=f"{index} {key}")


def test_a_checkpoints_optimizer_state_continues_through_the_flats():
    """A plain optimizer's state, flattened and loaded, continues as the plain optimizer does."""
    model, twin, flat = twins()
    plain_opt = adamw(lkrecipe.param_groups(model, WEIGHT_DECAY))
    loss_of(model, 0).backward()
    plain_opt.step()
    plain_opt.zero_grad(set_to_none=True)
    twin.load_state_dict(model.state_dict())
    flat_opt = adamw(flat.param_groups)
    flat_opt.load_state_dict(flat.flatten_optimizer_state(plain_opt.state_dict()))
    for net, opt in ((model, plain_opt), (flat, flat_opt)):
        loss_of(net, 1).backward()
        opt.step()
    for (name, p), q in zip(model.named_parameters(), twin.parameters(), strict=True):
        assert_close(q, p, msg=name)


def test_bad_groups_and_states_are_refused_with_one_message():
    model = lkat_lens.create_model("lkat_micro", num_classes=10)
    groups = lkrecipe.param_groups(model, WEIGHT_DECAY)
    with pytest.raises(ValueError, match="exactly once"):
        FlatParameters(model, groups[:1])
    with pytest.raises(ValueError, match="exactly once"):
        FlatParameters(model, [*groups, {"params": groups[0]["params"][:1]}])
    mixed = copy.deepcopy(model)
    mixed.cls_token.data = mixed.cls_token.data.double()
    with pytest.raises(ValueError, match="share a dtype and device"):
        FlatParameters(mixed, lkrecipe.param_groups(mixed, WEIGHT_DECAY))
    flat = FlatParameters(model, groups)
    other = lkat_lens.create_model("lkat_micro", num_classes=10, depth=1)
    state = adamw(lkrecipe.param_groups(other, WEIGHT_DECAY)).state_dict()
    with pytest.raises(ValueError, match="groups hold"):
        flat.flatten_optimizer_state(state)


def test_torch_compile_traces_the_flattened_model_as_one_graph():
    """A small timm ViT flattened and compiled (fullgraph): its logits and gradients are the plain model's."""
    torch.manual_seed(0)
    vit = VisionTransformer(img_size=16, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=5)
    twin = copy.deepcopy(vit)
    flat = FlatParameters(twin, [{"params": list(twin.parameters())}])
    compiled = torch.compile(flat, fullgraph=True)
    x = torch.randn(3, 3, 16, 16)
    expected, got = vit(x), compiled(x)
    assert_close(got, expected, atol=1e-5)
    expected.square().sum().backward()
    got.square().sum().backward()
    with flat.gradients_exposed():
        for (name, p), q in zip(vit.named_parameters(), twin.parameters(), strict=True):
            assert_close(q.grad, p.grad, atol=1e-5, msg=name)


def make_run(tmp_path, name: str, *extra: str) -> lktrain.Run:
    words = (
        f"--max-steps 2 --epochs 1 --batch-size 32 --threads 1 --telemetry-every 1 --out-dir {tmp_path} --name {name}"
    )
    args = lktrain.build_parser().parse_args([*words.split(), *extra])
    return lktrain.setup_run(args, lkdist.setup(args.device))


def test_a_compiled_run_trains_flat_and_writes_checkpoints_as_an_eager_run_does(tmp_path):
    """--compile flattens the model; run here through the flats uncompiled (inductor on this CPU takes minutes), it
    trains as the eager run does, its telemetry reads the same gradient norms per block, its checkpoint holds the
    per-parameter optimizer state an eager run writes, and each run's checkpoint resumes into the other kind."""
    eager = make_run(tmp_path, "eager")
    lktrain.train(eager)
    flat = make_run(tmp_path, "flat", "--compile")  # set up after the eager run: setting up seeds the run
    assert eager.flat is None and flat.flat is not None
    assert len(flat.trained_parameters()) < len(eager.trained_parameters())
    flat.forward = flat.flat  # what torch.compile wraps
    lktrain.train(flat)
    a = torch.load(tmp_path / "eager" / "last.pt", weights_only=True)
    b = torch.load(tmp_path / "flat" / "last.pt", weights_only=True)
    for name, value in a["state_dict"].items():
        assert_close(b["state_dict"][name], value, msg=name)
    assert b["optimizer"]["param_groups"] == a["optimizer"]["param_groups"]
    for index, state in a["optimizer"]["state"].items():
        for key, value in state.items():
            assert_close(b["optimizer"]["state"][index][key], value, msg=f"{index} {key}")
    records = [read_telemetry(tmp_path / name) for name in ("eager", "flat")]
    assert [r["kind"] for r in records[1]] == ["step", "step", "epoch"]
    for want, got in zip(*records, strict=True):
        norms = [(b["grad_norm"], c["grad_norm"]) for b, c in zip(want["blocks"], got["blocks"], strict=True)]
        assert all(g is not None and g == pytest.approx(w, rel=1e-5) for w, g in norms), (want["kind"], norms)
    into_eager = resume(tmp_path / "flat" / "last.pt")
    into_flat = resume(tmp_path / "eager" / "last.pt", "--compile")
    assert into_eager.flat is None and into_flat.flat is not None and into_eager.step == into_flat.step == 2
    for run, source in ((into_eager, b), (into_flat, a)):
        state = run.optimizer_state()
        assert state["param_groups"] == source["optimizer"]["param_groups"]
        for index, saved in source["optimizer"]["state"].items():
            assert all(torch.equal(state["state"][index][key], value) for key, value in saved.items())


def resume(checkpoint, *extra: str) -> lktrain.Run:
    args = lktrain.build_parser().parse_args(["--resume", str(checkpoint), "--threads", "1", *extra])
    return lktrain.setup_run(args, lkdist.setup(args.device))


def test_ddp_over_the_flats_averages_the_gradients_of_one_process(tmp_path):
    """Two gloo ranks, DDP over the flattened lkat_micro, half the batch each: every parameter's gradient is the one
    the model as it is takes from the whole batch in one process."""
    out = tmp_path / "grads.pt"
    mp.spawn(flat_ddp_worker.worker, args=(free_port(), str(out)), nprocs=2, join=True)
    model = flat_ddp_worker.seeded_model()
    images, labels = flat_ddp_worker.seeded_batch()
    torch.nn.functional.cross_entropy(model(images), labels).backward()
    got = torch.load(out, weights_only=True)
    for name, p in model.named_parameters():
        assert_close(got[name], p.grad, msg=name)
