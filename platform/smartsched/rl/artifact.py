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
service), and nothing read from one may run. Nor may it decide other than its files
declare: the spec must be what ``export_module`` writes (its keys named when not), the
weights exactly the module's parameters (each present, of its shape, floating point,
finite), and the files the folder's own (a link out of it is refused).
"""

from __future__ import annotations

import contextlib
import json
import logging
import warnings
from collections.abc import Iterator
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
    foreign artifact is a ValidationError naming the scheduler (and, where the damage is
    in what the files declare, the key or parameter)."""
    import gymnasium as gym
    import torch

    try:
        spec = json.loads(_artifact_file(folder, SPEC_FILE, MAX_SPEC_BYTES).read_text())
        _check_spec(spec, folder)
        cls = _module_classes()[spec["class"]]
        obs = gym.spaces.Dict({k: gym.spaces.Box(b["low"], b["high"], tuple(b["shape"]),
                                                 np.dtype(b["dtype"]))
                               for k, b in spec["observation_space"].items()})
        with _quiet_rllib_deprecation():
            module = cls(observation_space=obs,
                         action_space=gym.spaces.Discrete(int(spec["action_space"]["n"])),
                         inference_only=False, model_config=dict(spec["model_config"]))
        expected = module.state_dict()
        weights = _artifact_file(folder, WEIGHTS_FILE, _max_weights_bytes(expected))
        with warnings.catch_warnings():  # torch's own notes on a refused pickle: ours says it
            warnings.simplefilter("ignore")
            state = torch.load(weights, weights_only=True, map_location="cpu")
        _check_state(state, expected, folder)
        module.load_state_dict(state, strict=True)  # every parameter, nothing else
    except ValidationError:
        raise
    except Exception as e:  # any damage: name it, no traceback
        raise ValidationError("scheduler", f"cannot load the policy module at {folder} "
                              f"({type(e).__name__}): re-export or retrain it") from None
    return module


@contextlib.contextmanager
def _quiet_rllib_deprecation() -> Iterator[None]:
    """RLModule's constructor logs its own deprecation of ``RLModule(config=...)`` (it
    builds that config itself, whatever the caller passes): a WARNING line on every
    load, printed before the CLI's one-line errors. Only that logger, only here."""
    log = logging.getLogger("ray._common.deprecation")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


# The files of an export are small (the shipped one: 166 KB of weights, 1 KB of spec): a
# file far larger, or one that is not a plain file (a FIFO, a device), is not one.
MAX_SPEC_BYTES = 1 << 20


def _max_weights_bytes(expected: dict[str, Any]) -> int:
    """The largest weights file the module built from the spec can have: every value as
    float64, plus the archive's own records."""
    return 8 * sum(int(v.numel()) for v in expected.values()) + 4096 * len(expected) + (1 << 20)


def _artifact_file(folder: Path, name: str, max_bytes: int) -> Path:
    """``folder / name``, checked to be a plain file inside the folder (a link out of it
    would read a file the folder's owner did not ship: a service reads policies only from
    its models_dir) of at most ``max_bytes``."""
    path = folder / name
    if not path.exists():
        raise ValidationError("scheduler", f"{folder}: no {name} (re-export or retrain it)")
    real = path.resolve()
    if not real.is_relative_to(folder.resolve()):
        raise ValidationError("scheduler", f"{path}: links outside the policy folder; an "
                              "exported policy's files are its own")
    if not real.is_file():
        raise ValidationError("scheduler", f"{path}: not a file")
    size = real.stat().st_size
    if size > max_bytes:
        raise ValidationError("scheduler", f"{path}: {size:,} bytes, more than a policy's "
                              f"{name} can be ({max_bytes:,})")
    return real


# No trained policy has a weight near this (the shipped ones: |w| <= 11); a few layers of
# such weights overflow float32 to inf, and the scores to NaN: a silent wrong choice.
MAX_WEIGHT = 1e6
SPEC_KEYS = ("action_space", "class", "model_config", "observation_space")
OBS_KEYS = ("action_mask", "nodes", "pod", "weights")  # what NodeScorerModule observes
BOX_KEYS = ("dtype", "high", "low", "shape")


def _check_spec(spec: Any, folder: Path) -> None:
    """Refuse a spec that is not what ``export_module`` writes: its keys, their types, a
    module class on the allow-list, sane sizes (ValidationError naming the key)."""
    from smartsched.model.configfile import validate
    from smartsched.rl.config import Model

    where = folder / SPEC_FILE

    def refuse(key: str, message: str) -> ValidationError:
        return ValidationError("scheduler", f"{where}: {key}: {message}")

    def keys_of(doc: Any, key: str, keys: tuple[str, ...]) -> None:
        if not isinstance(doc, dict):
            raise refuse(key or "module spec", f"must be a mapping with {', '.join(keys)}")
        for k in sorted(set(doc) ^ set(keys)):
            raise refuse(f"{key}.{k[:40]}" if key else k[:40],
                         "unknown key" if k in doc else "missing")

    if isinstance(spec, dict) and "class" in spec and (
            not isinstance(spec["class"], str) or spec["class"] not in _module_classes()):
        raise ValidationError("scheduler", f"{folder}: module class {str(spec['class'])[:60]!r} "
                              "is not one SmartSched builds")
    keys_of(spec, "", SPEC_KEYS)
    keys_of(spec["observation_space"], "observation_space", OBS_KEYS)
    for k, b in spec["observation_space"].items():
        keys_of(b, f"observation_space.{k}", BOX_KEYS)
        for bound in ("low", "high"):
            v = b[bound]
            if isinstance(v, bool) or not isinstance(v, int | float) or not np.isfinite(v):
                raise refuse(f"observation_space.{k}.{bound}", f"must be a finite number, "
                             f"got {str(v)[:40]!r}")
        if b["dtype"] != "float32":
            raise refuse(f"observation_space.{k}.dtype", f"must be float32, got "
                         f"{str(b['dtype'])[:40]!r}")
    dims = {"nodes": 2, "pod": 1, "weights": 1, "action_mask": 1}
    for k, n in dims.items():
        shape = spec["observation_space"][k]["shape"]
        if isinstance(shape, list) and len(shape) != n:
            raise refuse(f"observation_space.{k}.shape", f"must have {n} dimension(s), got "
                         f"{str(shape)[:60]}")
    keys_of(spec["action_space"], "action_space", ("n",))
    if not isinstance(spec["model_config"], dict):
        raise refuse("model_config", "must be a mapping of the module's settings")
    _check_sizes(spec, folder)
    try:
        validate(Model, spec["model_config"], prefix="model_config")
    except ValidationError as e:
        raise refuse(e.field, e.message) from None


def _check_state(state: Any, expected: dict[str, Any], folder: Path) -> None:
    """Refuse weights that are not exactly the module's parameters: every one present, no
    other, each of its shape, floating point and finite (a NaN or an infinity scores
    every node alike or as NaN: a silent wrong choice, not a policy)."""
    import torch

    where = folder / WEIGHTS_FILE

    def refuse(message: str) -> ValidationError:
        return ValidationError("scheduler", f"{where}: {message}: re-export or retrain it")

    if not isinstance(state, dict) or not all(
            isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items()):
        raise refuse("not a mapping of parameter names to tensors")
    missing = [k for k in expected if k not in state]
    if missing:
        raise refuse(f"lacks {len(missing)} parameter(s) of the module its spec declares, "
                     f"first {missing[0][:80]!r}")
    unknown = sorted(k for k in state if k not in expected)
    if unknown:
        raise refuse(f"holds {len(unknown)} parameter(s) the module its spec declares has "
                     f"not, first {unknown[0][:80]!r}")
    for k, v in state.items():
        if not v.is_floating_point():
            raise refuse(f"parameter {k!r} holds {str(v.dtype)[6:]} values, not floating point")
        if v.shape != expected[k].shape:
            raise refuse(f"parameter {k!r} has shape {list(v.shape)}, the module its spec "
                         f"declares has {list(expected[k].shape)}")
        if not bool(torch.isfinite(v).all()):
            raise refuse(f"parameter {k!r} holds NaN or infinite values")
        if v.numel() and float(v.abs().max()) > MAX_WEIGHT:
            raise refuse(f"parameter {k!r} holds values beyond +-{MAX_WEIGHT:g}")


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
