"""Policy artifacts that load no code: the module's spec as JSON, its weights as tensors.

Owns the on-disk form of an exported policy's network. RLlib's checkpoint
(``class_and_ctor_args.pkl``, ``module_state.pkl``) is pickle: loading one runs
whatever it holds. An exported policy instead carries ``module_spec.json``
(the module class, from an allow-list, and its observation / action spaces and
model config as plain data) and ``module_weights.pt`` (a tensor state dict,
read with ``torch.load(weights_only=True)``, which refuses anything but
tensors and containers). ``write_module`` converts a checkpoint the trainer
just wrote (trusted: this process made it); ``read_module`` is what every
reader uses, and it refuses a pickle checkpoint outright: a policy folder may
come from anyone (``rl:PATH`` on the command line, a live reload of the
service), and nothing read from one may run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from smartsched.model.errors import ValidationError
from smartsched.rl.config import MAX_WIDTH

SPEC_FILE = "module_spec.json"
WEIGHTS_FILE = "module_weights.pt"
PICKLE_FILES = ("class_and_ctor_args.pkl", "module_state.pkl")


def _module_classes() -> dict[str, type]:
    from smartsched.rl.module import NodeScorerModule

    return {"NodeScorerModule": NodeScorerModule}  # the allow-list


def _box(space: Any) -> dict[str, Any]:
    lo, hi = np.unique(space.low), np.unique(space.high)
    if lo.size != 1 or hi.size != 1:
        raise ValueError("only boxes with uniform bounds are exported")
    return {"low": float(lo[0]), "high": float(hi[0]), "shape": list(space.shape),
            "dtype": str(space.dtype)}


def write_module(folder: Path) -> None:
    """Replace the RLlib checkpoint in ``folder`` (written by this process) with the
    code-free spec and weights."""
    from ray.rllib.core.rl_module.rl_module import RLModule

    export_module(RLModule.from_checkpoint(str(Path(folder).resolve())), folder)
    for f in PICKLE_FILES:
        (folder / f).unlink(missing_ok=True)


def export_module(module: Any, folder: Path) -> None:
    """Write ``module`` (in memory) to ``folder`` as spec JSON plus tensor weights."""
    import torch

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    name = type(module).__name__
    if name not in _module_classes():
        raise ValueError(f"{name} is not an exportable module class")
    spec = {"class": name,
            "observation_space": {k: _box(v) for k, v in module.observation_space.spaces.items()},
            "action_space": {"n": int(module.action_space.n)},
            "model_config": dict(module.model_config)}
    (folder / SPEC_FILE).write_text(json.dumps(spec, indent=1, sort_keys=True))
    state = {k: torch.as_tensor(np.asarray(v)) for k, v in module.get_state().items()}
    torch.save(state, folder / WEIGHTS_FILE)


def load_module(folder: Path) -> Any:
    """The module of an exported policy, built from its spec and weights; a damaged or
    foreign artifact is a ValidationError naming the scheduler."""
    import gymnasium as gym
    import torch

    try:
        spec = json.loads((folder / SPEC_FILE).read_text())
        cls = _module_classes().get(spec["class"])
        if cls is None:
            raise ValidationError("scheduler", f"{folder}: module class {spec['class']!r} "
                                  "is not one SmartSched builds")
        _check_sizes(spec, folder)
        obs = gym.spaces.Dict({k: gym.spaces.Box(b["low"], b["high"], tuple(b["shape"]),
                                                 np.dtype(b["dtype"]))
                               for k, b in spec["observation_space"].items()})
        module = cls(observation_space=obs,
                     action_space=gym.spaces.Discrete(int(spec["action_space"]["n"])),
                     inference_only=False, model_config=dict(spec["model_config"]))
        state = torch.load(folder / WEIGHTS_FILE, weights_only=True, map_location="cpu")
        module.set_state(state)
    except ValidationError:
        raise
    except Exception as e:  # any damage: name it, no traceback
        raise ValidationError("scheduler", f"cannot load the policy module at {folder} "
                              f"({type(e).__name__}): re-export or retrain it") from None
    return module


# What a policy SmartSched trains can declare: far above any real one (a 100,000-node
# cluster; layers as wide as a training config allows, rl.config.MAX_WIDTH), far below
# what would exhaust memory while the module is built, before its weights are even read
# (a spec is data: it must not size allocations).
MAX_OBS_VALUES = 20_000_000
MAX_ACTIONS = 1_000_001


def _check_sizes(spec: dict[str, Any], folder: Path) -> None:
    """Refuse a spec whose spaces or layers are absurdly large (ValidationError)."""
    total = 0
    for k, b in spec["observation_space"].items():
        shape = b["shape"]
        if not (isinstance(shape, list) and shape and all(
                isinstance(d, int) and not isinstance(d, bool) and 0 < d <= MAX_OBS_VALUES
                for d in shape)):
            raise ValidationError("scheduler", f"{folder}: observation {k!r} has shape "
                                  f"{str(shape)[:60]}, not a list of sizes in 1.."
                                  f"{MAX_OBS_VALUES:,}")
        total += int(np.prod(shape, dtype=np.float64))
    n = spec["action_space"]["n"]
    widths = [spec["model_config"].get(k, 32) for k in ("hidden", "topology_dim")]
    if total > MAX_OBS_VALUES or not (isinstance(n, int) and 0 < n <= MAX_ACTIONS) or not all(
            isinstance(w, int) and not isinstance(w, bool) and 0 < w <= MAX_WIDTH
            for w in widths):
        raise ValidationError("scheduler", f"{folder}: the module spec declares sizes no "
                              f"SmartSched policy has (observation values {total:.3g}, "
                              f"actions {str(n)[:20]}, hidden and topology widths "
                              f"{str(widths)[:40]})")


def read_module(folder: Path) -> Any:
    """The module of the exported policy in ``folder``; never reads pickle. An RLlib
    checkpoint (pickle) is a ValidationError pointing at the export training writes."""
    if (folder / SPEC_FILE).exists():
        return load_module(folder)
    raise ValidationError(
        "scheduler", f"{folder} is an RLlib checkpoint, not an exported policy: RLlib "
        "checkpoints are pickle, which runs code when loaded, so SmartSched never reads "
        "them; use the policy/ folder `smartsched train` exports at every checkpoint")
