"""The LSTM forecaster: next-H-step load with an 80 % prediction interval.

Owns the learned model. Per window, values are normalized by the mean of the
window's past (scale-free across machines); an LSTM reads the last
``lookback`` steps (values + time-of-day / day-of-week features); a head
reads its final state and the forecast steps' time features and predicts,
for every horizon step and target, three quantiles (10 %, 50 %, 90 %) of the
change from the last observed value. Training minimizes the pinball loss with
Adam, stops early on the validation MAE of the median, and is seeded. The
interval is then calibrated on the validation windows (one width factor, as
in split-conformal prediction) so that it covers 80 % there.

Saved as ``forecaster.pt`` (state dict) and ``forecaster.json`` (settings,
calibration, training record) in one folder.
"""

from __future__ import annotations

import io
import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from smartsched.forecast.windows import Windows, time_features
from smartsched.paths import read_regular_file

# The most a forecaster.json may hold (a few settings and provenance), and its weights
# (the largest network ``forecast train`` makes is a few MB).
MAX_META_BYTES = 1 << 20
MAX_WEIGHTS_BYTES = 256 << 20

QUANTILES = (0.1, 0.5, 0.9)


@dataclass
class LSTMSettings:
    lookback: int = 36
    horizon: int = 3
    hidden: int = 64
    layers: int = 1
    epochs: int = 20
    batch: int = 512
    lr: float = 2e-3
    patience: int = 3
    seed: int = 0
    targets: tuple[str, ...] = ()
    step_s: float = 300.0
    interval_scale: list[float] = field(default_factory=list)  # per target
    history: list[dict[str, float]] = field(default_factory=list)


def _net(s: LSTMSettings, k: int) -> Any:
    import torch
    from torch import nn

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lstm = nn.LSTM(k + 4, s.hidden, num_layers=s.layers, batch_first=True)
            self.head = nn.Sequential(nn.Linear(s.hidden + 4 * s.horizon + k, s.hidden),
                                      nn.ReLU(), nn.Linear(s.hidden, s.horizon * k * 3))

        def forward(self, x: torch.Tensor, tf: torch.Tensor, last: torch.Tensor
                    ) -> torch.Tensor:
            _, (h, _) = self.lstm(x)
            z = torch.cat([h[-1], tf.flatten(1), last], dim=-1)
            q = self.head(z).view(-1, s.horizon, k, 3)
            # Monotone quantiles: median, then non-negative offsets below and above.
            mid = q[..., 1]
            lo = mid - nn.functional.softplus(q[..., 0])
            hi = mid + nn.functional.softplus(q[..., 2])
            return torch.stack([lo, mid, hi], dim=-1)

    return Net()


class LSTMForecaster:
    name = "LSTM"

    def __init__(self, settings: LSTMSettings | None = None) -> None:
        self.s = settings or LSTMSettings()
        self.net: Any = None

    # ---------------------------------------------------------------- tensors
    def _inputs(self, w: Windows) -> tuple[np.ndarray, ...]:
        s = self.s
        if w.past.shape[1] < s.lookback:  # sliced short, then a shape error (or 24 GB)
            from smartsched.model.errors import ValidationError

            raise ValidationError("lookback", f"the model looks back {s.lookback} steps; "
                                  f"these windows hold {w.past.shape[1]}")
        past = w.past[:, -s.lookback:, :]
        scale = np.maximum(past.mean(axis=1, keepdims=True), 1e-3)  # [N, 1, K]
        x = past / scale
        t_past = time_features(w.origin_s - s.step_s * s.lookback, s.lookback, s.step_s)
        tf = time_features(w.origin_s, s.horizon, s.step_s)
        last = x[:, -1, :]
        return (np.concatenate([x, t_past], -1).astype(np.float32), tf, last.astype(
            np.float32), scale.astype(np.float32))

    def _quantiles(self, w: Windows) -> np.ndarray:
        """[N, H, K, 3] in the data's units."""
        import torch

        x, tf, last, scale = self._inputs(w)
        out = []
        self.net.eval()
        with torch.no_grad():
            for i in range(0, len(w), 8192):
                q = self.net(torch.from_numpy(x[i:i + 8192]), torch.from_numpy(tf[i:i + 8192]),
                             torch.from_numpy(last[i:i + 8192])).numpy()
                out.append(q)
        q = np.concatenate(out) if out else np.zeros((0, self.s.horizon, x.shape[2] - 4, 3))
        q = q + last[:, None, :, None]
        return q * scale[:, :, :, None]

    # ---------------------------------------------------------------- API
    def fit(self, train: Windows, val: Windows | None = None,
            progress: Callable[[str], Any] | None = None) -> None:
        import torch

        s = self.s
        if not len(train):  # trained on nothing, it was saved and scored as a model
            from smartsched.model.errors import ValidationError

            raise ValidationError("lookback", f"no training window: no training series is "
                                  f"{s.lookback} + {s.horizon} steps long (lower --lookback)")
        self.init_net(train)
        rng = np.random.default_rng(s.seed)
        opt = torch.optim.Adam(self.net.parameters(), lr=s.lr)
        data = self.training_tensors(train)
        best, best_state, bad = np.inf, None, 0
        for epoch in range(s.epochs):
            t0 = time.perf_counter()
            rec = {"epoch": epoch + 1, "train_pinball": self.train_epoch(data, opt, rng),
                   "seconds": time.perf_counter() - t0}
            if val is not None and len(val):
                rec["val_mae"] = float(np.abs(self.predict(val) - val.future[:, : s.horizon])
                                       [:, -1].mean())
            s.history.append(rec)
            if progress:
                progress(" ".join(f"{k} {v:.4g}" for k, v in rec.items()))
            score = rec.get("val_mae", rec["train_pinball"])
            if score < best - 1e-6:
                best, bad = score, 0
                best_state = {k: v.clone() for k, v in self.net.state_dict().items()}
            else:
                bad += 1
                if bad >= s.patience:
                    break
        if best_state is not None:
            self.net.load_state_dict(best_state)
        if val is not None and len(val):
            self.calibrate(val)

    # The pieces of ``fit``, also driven one epoch at a time by federated training
    # (``smartsched.federation``), where each site runs epochs on its own windows.
    def init_net(self, train: Windows) -> None:
        """A fresh, seeded network for ``train``'s targets and step."""
        import torch

        self.s.targets, self.s.step_s = tuple(train.targets), float(train.step_s)
        torch.manual_seed(self.s.seed)
        self.net = _net(self.s, train.past.shape[2])

    def training_tensors(self, train: Windows) -> tuple[np.ndarray, ...]:
        """(inputs, time features, last value, target change) of ``train``'s windows."""
        x, tf, last, scale = self._inputs(train)
        y = (train.future[:, : self.s.horizon, :] / scale - last[:, None, :]).astype(np.float32)
        return x, tf, last, y

    def train_epoch(self, data: tuple[np.ndarray, ...], opt: Any, rng: np.random.Generator,
                    anchor: dict[str, Any] | None = None, mu: float = 0.0) -> float:
        """One pass over ``data`` (from ``training_tensors``) in shuffled minibatches; the
        mean pinball loss. ``anchor`` and ``mu`` add FedProx's proximal term
        ``mu / 2 * ||w - anchor||^2``, which keeps a site's update near the global model."""
        import torch

        x, tf, last, y = data
        qs = torch.tensor(QUANTILES)
        params = dict(self.net.named_parameters())
        self.net.train()
        order = rng.permutation(len(x))
        total = 0.0
        for i in range(0, len(order), self.s.batch):
            b = order[i:i + self.s.batch]
            q = self.net(torch.from_numpy(x[b]), torch.from_numpy(tf[b]),
                         torch.from_numpy(last[b]))
            err = torch.from_numpy(y[b]).unsqueeze(-1) - q
            loss = torch.maximum(qs * err, (qs - 1) * err).mean()
            total += loss.item() * len(b)
            if anchor is not None and mu > 0:
                loss = loss + mu / 2 * sum(((params[k] - anchor[k]) ** 2).sum()
                                           for k in anchor)
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.net.parameters(), 1.0)
            opt.step()
        return total / max(len(x), 1)

    def calibrate(self, val: Windows, target: float = 0.8) -> list[float]:
        """Scale each target's interval so it covers ``target`` of the validation actuals
        at the last horizon step."""
        q = self._quantiles(val)[:, -1]  # [N, K, 3]
        y = val.future[:, self.s.horizon - 1]
        scales = []
        for k in range(q.shape[1]):
            lo_d, hi_d = q[:, k, 1] - q[:, k, 0], q[:, k, 2] - q[:, k, 1]
            a, b = 0.05, 20.0
            for _ in range(40):  # coverage grows with the scale: bisect
                c = (a + b) / 2
                cov = ((y[:, k] >= q[:, k, 1] - c * lo_d)
                       & (y[:, k] <= q[:, k, 1] + c * hi_d)).mean()
                a, b = (c, b) if cov < target else (a, c)
            scales.append((a + b) / 2)
        self.s.interval_scale = scales
        return scales

    def predict(self, w: Windows) -> np.ndarray:
        return self._quantiles(w)[..., 1]

    def interval(self, w: Windows) -> tuple[np.ndarray, np.ndarray]:
        q = self._quantiles(w)
        k = q.shape[2]
        c = np.asarray(self.s.interval_scale or [1.0] * k, dtype=np.float32)[None, None, :]
        return q[..., 1] - c * (q[..., 1] - q[..., 0]), q[..., 1] + c * (q[..., 2] - q[..., 1])

    def save(self, folder: str | Path) -> Path:
        import torch

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        torch.save(self.net.state_dict(), folder / "forecaster.pt")
        (folder / "forecaster.json").write_text(json.dumps(asdict(self.s), indent=2) + "\n")
        return folder

    @staticmethod
    def load(folder: str | Path) -> LSTMForecaster:
        import torch

        from smartsched.model.errors import ValidationError

        folder = Path(folder)
        try:
            meta = json.loads(read_regular_file(folder / "forecaster.json", MAX_META_BYTES))
        except (OSError, ValueError, RecursionError) as e:  # not JSON, not UTF-8, too deep
            raise ValidationError("model", f"no forecaster at {folder}: {e}") from None
        if not isinstance(meta, dict):
            raise ValidationError("model", f"{folder}/forecaster.json must hold a mapping of "
                                  "settings")
        from dataclasses import fields

        known = {f.name for f in fields(LSTMSettings)}  # other keys are provenance
        try:
            s = LSTMSettings(**{k: v for k, v in meta.items() if k in known})
        except TypeError as e:
            raise ValidationError("model", f"{folder}/forecaster.json: {e}") from None
        _check_settings(s, folder / "forecaster.json")
        s.targets = tuple(s.targets)
        fc = LSTMForecaster(s)
        try:
            fc.net = _net(s, len(s.targets))
            # a FIFO waited for a writer forever: the bytes of a regular file, bounded
            raw = read_regular_file(folder / "forecaster.pt", MAX_WEIGHTS_BYTES)
            fc.net.load_state_dict(torch.load(io.BytesIO(raw), weights_only=True,
                                              map_location="cpu"))
        except Exception as e:  # missing, damaged or mismatched weights: name them
            raise ValidationError("model", f"cannot load the forecaster weights at "
                                  f"{folder / 'forecaster.pt'} ({type(e).__name__}): "
                                  "retrain it (smartsched forecast train)") from None
        return fc


# The largest window and network ``forecast train`` and ``federate`` make (their options'
# ranges): a saved forecaster's settings past them are refused before torch builds it.
SETTING_MAX = {"lookback": 10_000, "horizon": 1_000, "hidden": 4_096, "layers": 8}


def _check_settings(s: LSTMSettings, source: Path) -> None:
    """The settings a saved forecaster's file must hold for its weights and the data it
    is applied to to make sense: its targets (column names, checked against the data by
    ``forecast evaluate``), its step and its window sizes."""
    from smartsched.model.errors import ValidationError

    t = s.targets
    if (not isinstance(t, list | tuple) or not t
            or not all(isinstance(x, str) and x for x in t) or len(set(t)) != len(t)):
        raise ValidationError("targets", f"must be a list of distinct column names, got {t!r}",
                              source=str(source))
    st = s.step_s
    if isinstance(st, bool) or not isinstance(st, int | float) or not 0 < st < float("inf"):
        raise ValidationError("step_s", f"must be a positive number of seconds, got {st!r}",
                              source=str(source))
    for name in ("lookback", "horizon", "hidden", "layers"):
        v, most = getattr(s, name), SETTING_MAX[name]
        # the most ``forecast train`` makes: a saved "hidden": 12000 built a 3 GB network
        # before the weights were found not to fit it (and 30000 took more than memory)
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= most:
            raise ValidationError(name, f"must be an integer in [1, {most:,}], got {v!r}",
                                  source=str(source))
    sc = s.interval_scale
    if not isinstance(sc, list) or (sc and (len(sc) != len(t) or not all(
            isinstance(x, int | float) and not isinstance(x, bool) and 0 < x < float("inf")
            for x in sc))):
        raise ValidationError("interval_scale", f"must be one positive number per target "
                              f"({len(t)}), got {sc!r}", source=str(source))
