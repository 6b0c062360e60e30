"""The reference trainer's checkpoints: its `cfg` -> lkat-lens model name, model kwargs and dataset info.

The reference code builds its model from the training config (models/build.py there): `model` picks the
variant, a fixed set of cfg keys overrides the variant's constructor arguments, `input_size` is the image size
and `dataset` fixes the class count and the normalisation. This module reads the same keys the same way, so the
rebuilt model computes what the reference's did; a value lkat-lens cannot rebuild is refused by name.
Every other cfg key (optimiser, schedule, augmentation, paths, ...) never reaches the reference's model.
"""

from __future__ import annotations

from typing import Any

import torch

from .checkpoint import CheckpointError, CheckpointInfo

# Reference variant name -> lkat-lens registry name.
LKAT_NAMES = {
    "LKAT-T": "lkat_tiny_patch16_224",
    "LKAT-S": "lkat_small_patch16_224",
    "LKAT-B": "lkat_base_patch16_224",
    "LKAT-L": "lkat_large_patch16_224",
}
KATT_NAMES = {
    "KATT-T": "rbfkat_tiny_patch16_224",
    "KATT-S": "rbfkat_small_patch16_224",
    "KATT-B": "rbfkat_base_patch16_224",
}
GATING_NAME = "LKAT-B-RBF-Gating"  # the reference's LKAT-B with gated-residual KAN layers (our kan_gated)

# The reference's default constructor arguments per family (class defaults, then its variant table's entries).
_COMMON_DEFAULTS: dict[str, Any] = {
    "mlp_ratio": 4.0,
    "patch_size": 16,
    "kan_num_grids": 4,
    "kan_base_update": False,
    "drop_rate": 0.0,
    "attn_drop_rate": 0.0,
    "drop_path_rate": 0.0,
    "use_cls_token": True,
    "num_registers": 4,
    "use_abs_pos": True,
    "rope_mode": "2dv1",
    "rope_theta": 10000.0,
}
LKAT_DEFAULTS = {
    **_COMMON_DEFAULTS,
    "kan_grid_min": -2.0,
    "kan_grid_max": 2.0,
    "kan_layernorm": False,
    "use_short_conv": True,
    "conv_size": 4,
    "expand_k": 1.0,
    "expand_v": 1.0,
}
KATT_DEFAULTS = {**_COMMON_DEFAULTS, "kan_grid_min": -1.0, "kan_grid_max": 1.0, "kan_layernorm": True}

# cfg key -> (lkat-lens kwarg, type), in the reference's order (a later key wins: `grid` over `kan_num_grids`).
_SHARED_KEYS: dict[str, tuple[str, type]] = {
    "embed_dim": ("embed_dim", int),
    "depth": ("depth", int),
    "num_heads": ("num_heads", int),
    "mlp_ratio": ("mlp_ratio", float),
    "patch_size": ("patch_size", int),
    "kan_num_grids": ("kan_num_grids", int),
    "grid": ("kan_num_grids", int),
    "kan_grid_min": ("kan_grid_min", float),
    "kan_grid_max": ("kan_grid_max", float),
    "use_base_update": ("kan_base_update", bool),
    "use_layernorm": ("kan_layernorm", bool),
    "drop_path_rate": ("drop_path_rate", float),
    "use_cls_token": ("use_cls_token", bool),
    "num_registers": ("num_registers", int),
    "use_abs_pos": ("use_abs_pos", bool),
    "attn_drop_rate": ("attn_drop_rate", float),
    "rope_mode": ("rope_mode", str),
    "rope_theta": ("rope_theta", float),
    "dropout": ("drop_rate", float),
}
_GLA_KEYS: dict[str, tuple[str, type]] = {
    "expand_k": ("expand_k", float),
    "expand_v": ("expand_v", float),
    "use_short_conv": ("use_short_conv", bool),
    "conv_size": ("conv_size", int),
}
# cfg keys the reference's builder reads and that do not change the computation.
NO_EFFECT_KEYS = {
    "kan_compile": "torch.compile of the KAN layers: same function",
    "kan_type": "must be the RBF KAN (rbf / triton / triton_rbf), the only KAN there is",
}
RBF_KAN_TYPES = ("rbf", "triton", "triton_rbf")
ROPE_MODES = ("2dv0", "2dv1")

# The reference's datasets: class count and normalisation (its dataset_loader), evaluation transform (its
# transforms.py: Resize(size / 0.875, bicubic) -> CenterCrop(size)).
DATASETS: dict[str, dict[str, Any]] = {
    "cifar10": {"num_classes": 10, "mean": (0.4914, 0.4822, 0.4465), "std": (0.2023, 0.1994, 0.2010)},
    "cifar100": {"num_classes": 100, "mean": (0.5071, 0.4865, 0.4409), "std": (0.2673, 0.2564, 0.2762)},
    "imagenet100": {"num_classes": 100, "mean": (0.4850, 0.4560, 0.4060), "std": (0.2290, 0.2240, 0.2250)},
}
CIFAR10_CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
CIFAR100_CLASSES = """apple aquarium_fish baby bear beaver bed bee beetle bicycle bottle bowl boy bridge bus butterfly
camel can castle caterpillar cattle chair chimpanzee clock cloud cockroach couch crab crocodile cup dinosaur dolphin
elephant flatfish forest fox girl hamster house kangaroo keyboard lamp lawn_mower leopard lion lizard lobster man
maple_tree motorcycle mountain mouse mushroom oak_tree orange orchid otter palm_tree pear pickup_truck pine_tree plain
plate poppy porcupine possum rabbit raccoon ray road rocket rose sea seal shark shrew skunk skyscraper snail snake
spider squirrel streetcar sunflower sweet_pepper table tank telephone television tiger tractor train trout tulip
turtle wardrobe whale willow_tree wolf woman worm""".split()
CLASS_NAMES = {"cifar10": CIFAR10_CLASSES, "cifar100": CIFAR100_CLASSES}
EVAL_CROP_PCT, EVAL_INTERPOLATION = 0.875, "bicubic"


def _refuse(key: str, value: Any, why: str) -> CheckpointError:
    return CheckpointError(f"reference cfg option {key}={value!r}: {why}")


def resolve_variant(cfg: dict[str, Any]) -> tuple[str, str, dict[str, Any]]:
    """(lkat-lens model name, family "lkat"/"katt", fixed kwargs) of the cfg's `model`, as the reference picks it."""
    if cfg.get("timm_model"):
        raise _refuse("timm_model", cfg["timm_model"], "a timm baseline, not an LKAT/KATT model lkat-lens rebuilds")
    name = str(cfg.get("model", "LKAT-S"))
    if name in KATT_NAMES:
        return KATT_NAMES[name], "katt", {}
    if name.startswith("KATT"):
        raise _refuse("model", name, f"not a reference KATT variant ({', '.join(KATT_NAMES)})")
    low = name.lower().replace("_", "-")
    if "rbf-gating" in low:
        if not ("rbf" in low and "gat" in low and "LKAT-B" in name.upper().replace("_", "-")):
            raise _refuse("model", name, f"not a reference RBF-gating variant ({GATING_NAME})")
        return LKAT_NAMES["LKAT-B"], "lkat", {"kan_gated": True, "kan_base_update": False}
    if name in LKAT_NAMES:
        return LKAT_NAMES[name], "lkat", {}
    if name.startswith("LKAT"):
        raise _refuse("model", name, f"not a reference LKAT variant ({', '.join(LKAT_NAMES)})")
    raise _refuse("model", name, "lkat-lens rebuilds the reference's LKAT-*, KATT-* and LKAT-B-RBF-Gating models")


def reference_model_kwargs(cfg: dict[str, Any]) -> tuple[str, dict[str, Any], dict[str, str]]:
    """(model name, kwargs, provenance) that rebuild the reference model a training cfg describes."""
    name, family, fixed = resolve_variant(cfg)
    defaults = LKAT_DEFAULTS if family == "lkat" else KATT_DEFAULTS
    label = str(cfg.get("model", "LKAT-S"))
    kwargs = dict(defaults)
    provenance = {"model_name": f"cfg['model']={label!r}" if "model" in cfg else "reference default model 'LKAT-S'"}
    provenance |= {k: f"reference {label} default" for k in kwargs}
    keys = {**_SHARED_KEYS, **(_GLA_KEYS if family == "lkat" else {})}
    for cfg_key, (kwarg, kind) in keys.items():
        if cfg_key in cfg:
            kwargs[kwarg] = _typed(cfg_key, cfg[cfg_key], kind)
            provenance[kwarg] = f"cfg[{cfg_key!r}]"
    for kwarg, value in fixed.items():
        kwargs[kwarg] = value
        provenance[kwarg] = f"fixed by {label}"
    _check_options(cfg, family, kwargs)
    kwargs["img_size"] = _typed("input_size", cfg.get("input_size", 224), int)
    provenance["img_size"] = "cfg['input_size']" if "input_size" in cfg else "reference default input_size 224"
    return name, kwargs, provenance


def _typed(key: str, value: Any, kind: type) -> Any:
    if kind is bool:
        return bool(value)  # the reference tests these options for truth
    try:
        return kind(value)
    except (TypeError, ValueError):
        raise _refuse(key, value, f"expected {kind.__name__}") from None


def _check_options(cfg: dict[str, Any], family: str, kwargs: dict[str, Any]) -> None:
    """Refuse, by name, values the reference itself rejects (so no such model was ever trained)."""
    if family == "lkat" and str(cfg.get("kan_type", "rbf")).lower() not in RBF_KAN_TYPES:
        raise _refuse("kan_type", cfg["kan_type"], f"the reference's LKAT takes only {RBF_KAN_TYPES}")
    if kwargs["rope_mode"] not in ROPE_MODES:
        raise _refuse("rope_mode", kwargs["rope_mode"], f"the reference knows only {ROPE_MODES}")
    if kwargs["num_registers"] < 1:
        raise _refuse("num_registers", kwargs["num_registers"], "the reference needs at least one register")


def reference_data_info(cfg: dict[str, Any], img_size: int) -> tuple[dict[str, Any], dict[str, str]]:
    """The dataset's name, normalisation, evaluation transform and class names, with where each came from."""
    raw = str(cfg.get("dataset", "cifar10"))
    name = raw.lower().replace("-", "_")
    name = "imagenet100" if name in ("imagenet_100", "in100") else name
    if name not in DATASETS:
        raise _refuse("dataset", raw, f"the reference trains only on {sorted(DATASETS)}")
    spec = DATASETS[name]
    source = f"reference dataset table for {name!r}"
    data = {
        "name": name,
        "mean": list(spec["mean"]),
        "std": list(spec["std"]),
        "img_size": img_size,
        "crop_pct": EVAL_CROP_PCT,
        "interpolation": EVAL_INTERPOLATION,
        "class_names": list(CLASS_NAMES.get(name, [])),
    }
    provenance = {
        "data.name": "cfg['dataset']" if "dataset" in cfg else "reference default dataset 'cifar10'",
        "data.mean": source,
        "data.std": source,
        "data.img_size": "cfg['input_size']" if "input_size" in cfg else "reference default input_size 224",
        "data.crop_pct": "reference evaluation transform",
        "data.interpolation": "reference evaluation transform",
        "data.class_names": f"standard {name} class names" if name in CLASS_NAMES else "not recorded (indices)",
    }
    return data, provenance


def reference_info(obj: dict[str, Any], state_dict: dict[str, torch.Tensor], path: str) -> CheckpointInfo:
    """CheckpointInfo of a reference trainer checkpoint: model, data and training state from its `cfg`."""
    cfg = obj["cfg"]
    if not isinstance(cfg, dict):
        raise CheckpointError(f"{path}: the reference checkpoint's 'cfg' is a {type(cfg).__name__}, not a dict")
    name, kwargs, provenance = reference_model_kwargs(cfg)
    data, data_provenance = reference_data_info(cfg, kwargs["img_size"])
    kwargs["num_classes"] = DATASETS[data["name"]]["num_classes"]
    provenance["num_classes"] = f"class count of {data['name']!r}"
    head = state_dict.get("head.weight")
    if head is not None and head.shape[0] != kwargs["num_classes"]:
        raise CheckpointError(
            f"{path}: head.weight has {head.shape[0]} classes but cfg dataset={cfg.get('dataset')!r} has "
            f"{kwargs['num_classes']}"
        )
    train = {k: obj[k] for k in ("epoch", "best_epoch", "max_accuracy", "seed") if k in obj}
    train["args"] = dict(cfg)
    return CheckpointInfo(
        path=path,
        model_name=name,
        model_kwargs=kwargs,
        data=data,
        train=train,
        format="reference-trainer",
        provenance={**provenance, **data_provenance},
    )
