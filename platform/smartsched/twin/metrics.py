"""Metrics: computed only here, identically for every scheduler.

Owns every figure a report shows. Quantities that change only at events
(allocation, powered-on capacity, idle power, price) are integrated exactly
between events; quantities that depend on actual use (usage, dynamic power,
contention, fairness, cross-zone traffic, fragmentation) are sampled at metric
ticks and held until the next one. Latency percentiles come from the pod
table at the end.

Definitions (time-weighted over the simulated span T):
  allocation[r]      = int allocated_r dt / int capacity_r dt                (all capacity)
  allocation_on[r]   = int allocated_r dt / int powered-on capacity_r dt
  usage[r], usage_on[r]  likewise with actual use, sampled at ticks and held; a node's
                       use counts up to its capacity (demand beyond it is contention,
                       under slo), and usage_on divides by the powered-on capacity held
                       over the same spans, so neither passes 100 %
  gpu_allocation_rate = allocation[gpu] (replay); allocated/total at the end (fill)
  energy_kwh         = int sum_nodes (idle + dynamic watts) * PUE(site) dt
                       dynamic = (max-idle)_host * cpu_use + sum_gpu (max-idle) * gpu_use
  carbon_kg          = int energy rate * carbon intensity(site, t) dt
  green              = GreenScore (carbon.greenscore) over the run, weighted by facility
                       energy: pue_share = IT energy / facility energy; renewable_share =
                       int facility watts * grid renewable share(site, t) dt / energy;
                       efficiency = int sum_nodes use * full-load watts dt / IT energy (use
                       weighted by the watts each part adds); score = the energy-weighted
                       mean of each site's GreenScore at each moment
  pods' carbon       = per pod, its share of its node's dynamic watts (cpu and GPU, by
                       its share of the node's use), times the site's PUE and grid
                       intensity, over the ticks: the carbon a placement or a shift in
                       time can move (idle watts are the cluster's, not a pod's)
  cost_usd           = int sum powered-on nodes (cores * core-hour + gpus * gpu-hour price) dt
  fairness_jain      = mean over ticks of (sum x)^2 / (n sum x^2), x = tenants' dominant shares
  cross_zone_gb_per_h = mean over ticks of sum_pods traffic * (share of app peers in other zones)
  slo                = online pod-time on nodes whose use exceeds capacity; edge/latency pods
                       whose client latency exceeds their SLO
  waiting_pod_hours  = sum over measured pods of (placed - arrival), or (end - arrival)
                       for pods still waiting: queueing percentiles cover placed pods
                       only, so this is the figure a scheduler cannot improve by
                       leaving pods in the queue
  start_latency_all  = start latency percentiles with pods not started by the end
                       counting (end - arrival), for the same reason
  availability       = per class, 1 - (time pods were down) / (time from their first start
                       to their end or the run's end): a pod is down from an involuntary
                       stop (its node failed, it was preempted or migrated) until it runs
                       again; the headline is online pods' (the replica-time they served)
  re-placement       = for pods stopped by a node failure: seconds from the failure until
                       bound to a node again and until running again (a node repaired
                       first restarts them in place); pods not running again by the end
                       count (end - failure) in ``to_running_all_s``
  batch_runs         = batch pods grouped by app (one nightly run): window = last finish
                       - first arrival; runs not finished by the end are "incomplete" and
                       count (end - first arrival); deadline misses are pods that finished
                       after their deadline or had not finished when it passed

A warm-up (``measure_from``) lets the cluster fill before measuring: nothing
before it counts, and per-pod figures cover pods arriving after it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from smartsched.carbon.greenscore import green_score
from smartsched.model.cluster import ClusterSpec
from smartsched.model.errors import ValidationError
from smartsched.model.pod import POD_CLASS_IDS, POD_CLASSES, PodClass
from smartsched.model.resources import CPU, DEVICE_MODELS, GPU, GPU_MODEL_NAMES, MEM
from smartsched.twin.decision import Rejection
from smartsched.twin.fragmentation import TargetWorkload, cluster_fragmentation
from smartsched.twin.podtable import BOUND, DONE, FAILED, NOT_ARRIVED, PENDING, RUNNING, PodTable
from smartsched.twin.power import PowerModel
from smartsched.twin.sampling import RunningUse
from smartsched.twin.state import POWER_OFF, POWER_ON, ClusterState

USAGE_RES = (CPU, MEM, GPU)
_ONLINE = POD_CLASSES.index(PodClass.ONLINE)


_PENDING_KEYS = tuple(f"pending_s.{c}" for c in POD_CLASS_IDS)  # snapshot's per-class keys


class MetricsRecorder:
    """Accumulates the twin's metrics as the engine advances."""

    def __init__(
        self,
        spec: ClusterSpec,
        state: ClusterState,
        table: PodTable,
        target: TargetWorkload,
        seed: int,
        measure_from: float = 0.0,
        full: bool = True,
        track_traffic: bool = False,
    ) -> None:
        self.measure_from = measure_from
        # False: keep only what ``snapshot`` (the RL step reward) reads; ``report`` refuses.
        self.full = full
        # Cross-zone traffic is a report figure; a reward that weighs it needs it per tick
        # even when nothing else of the report is kept.
        self.track_traffic = full or track_traffic
        self.state = state
        self.table = table
        self.target = target
        self.seed = seed
        n_sites = len(spec.sites)
        self.site_pue = np.array([s.pue for s in spec.sites])
        self.site_pue_share = 1.0 / self.site_pue  # GreenScore's PUE term (per event)
        self.site_carbon = [s.carbon for s in spec.sites]
        self.power_model = PowerModel.of(spec, state.gpu_model, state.gpu_count)
        self.node_idle_w = self.power_model.idle_w
        gpu_price = np.array([0.0] + [DEVICE_MODELS[m].price_factor for m in GPU_MODEL_NAMES])
        gm = state.gpu_model
        core_price = np.array([s.price_core_hour for s in spec.sites])[state.site_id]
        gpu_hour = np.array([s.price_gpu_hour for s in spec.sites])[state.site_id]
        self.node_price_h = (
            state.capacity[:, CPU] / 1000.0 * core_price
            + state.gpu_count * gpu_hour * gpu_price[gm]
        )
        # Sums over powered-on (or booting) nodes, kept current by power_changed().
        on = state.power != POWER_OFF
        # What ``advance`` integrates over time, as views into one vector so that one
        # multiply-add integrates them all (element by element the same arithmetic as one
        # per array); every update of these must stay in place (``+=``, ``[...] =``).
        r = state.capacity.shape[1]
        self._live = np.zeros(3 * r + 2)
        self._integrals = np.zeros_like(self._live)
        self.on_capacity = self._live[0:r]
        self.on_capacity[:] = state.capacity[on].sum(axis=0)
        self.on_nodes = int(on.sum())
        self.on_idle_w_site = np.bincount(state.site_id[on], self.node_idle_w[on], n_sites)
        self.on_price_h = float(self.node_price_h[on].sum())
        self.dyn_w_site = np.zeros(n_sites)
        # ``advance``'s rates and the time they hold until (``_energy_rates``).
        self._rates: tuple[float, float, float, float, float, float] = (0.0,) * 6
        self._rates_until = -np.inf
        # Work done in full-load watts (use * max watts of powered-on nodes), per site, and
        # the integrals behind the report's "green" (see the module docstring).
        self.work_w_site = np.zeros(n_sites)
        self.it_j = 0.0
        self.work_j = 0.0
        self.renewable_j = 0.0
        self.green_j = 0.0
        self.alloc_total = self._live[r:2 * r]
        self.be_alloc_total = self._live[3 * r:]  # best-effort cpu, mem requests
        self.int_be_alloc = self._integrals[3 * r:]
        self.be_demand_cpu_s = 0.0  # cpu-milli-seconds best-effort pods wanted
        self.be_throttled_cpu_s = 0.0  # ... and did not get (throttled for other pods)
        self.tenant_alloc = np.zeros((len(table.tenants), state.capacity.shape[1]))
        self.tenant_seen = np.zeros(len(table.tenants), dtype=bool)
        self.capacity_total = self._live[2 * r:3 * r]
        self.capacity_total[:] = state.capacity.sum(axis=0)

        # Integrals.
        self.t_start: float | None = None
        self.t_last = 0.0
        self.int_on_cap = self._integrals[0:r]
        self.int_alloc = self._integrals[r:2 * r]
        self.int_cap = self._integrals[2 * r:3 * r]
        self.int_on_nodes = 0.0
        self.pending = 0  # pods waiting in the queue now
        self.int_pending_s = 0.0
        self.pending_gpu = 0.0  # GPU milli asked by waiting pods
        self.int_pending_gpu_s = 0.0
        self.pending_cls = np.zeros(len(POD_CLASS_IDS), dtype=np.int64)  # waiting, per class
        self.int_pending_cls_s = np.zeros(len(POD_CLASS_IDS))
        self.int_usage = np.zeros(3)
        self.int_usage_time = 0.0
        # What a node can deliver of cpu / memory / GPU use (bursts beyond it contend), and
        # the powered-on part of it held over the usage samples' spans (usage_on's divisor:
        # the exact integral would set a sample held past a power-down against less).
        self._usage_cap = state.capacity[:, list(USAGE_RES)].astype(np.float64)
        self.int_on_cap_usage = np.zeros(3)
        self.energy_j = 0.0
        self.carbon_g = 0.0
        self.cost_usd = 0.0
        self.online_pod_s = 0.0
        self.online_contended_pod_s = 0.0
        # Seconds x share: of online pods in contention, of app traffic crossing zones (the
        # per-hour shares the ``contention`` and ``traffic`` reward components integrate).
        self.contended_share_s = 0.0
        self.cross_zone_share_s = 0.0
        self.contended_pods: set[int] = set()
        self.fairness: list[float] = []
        self.cross_zone: list[float] = []
        self.frag: list[float] = []
        self.rows: list[dict[str, float]] = []
        self.rejections: dict[str, int] = {}
        self.rejections_by_plugin: dict[str, int] = {}
        self.evictions = 0
        # Pods evicted by preemption, and run time lost to evictions (what was not kept by a
        # checkpoint), per class; counted after the warm-up.
        self.preemptions_cls = np.zeros(len(POD_CLASS_IDS), dtype=np.int64)
        self.lost_s_cls = np.zeros(len(POD_CLASS_IDS))
        self.migrations_cls = np.zeros(len(POD_CLASS_IDS), dtype=np.int64)  # descheduling
        self.decision_seconds: list[float] = []
        self.node_failures = 0
        self.failure_log: list[tuple[float, int]] = []  # (time, node) of every failure
        self.downtime_cls = np.zeros(len(POD_CLASS_IDS))  # seconds pods were down
        # Pods stopped by a node failure and running again: (class, failure -> bound again
        # (nan: restarted in place), failure -> running).
        self.replacements: list[tuple[int, float, float]] = []
        # Starts of multi-GPU pods after the warm-up (replay): (sockets their devices span,
        # fewest sockets their node could give, NVLink-meshed node, run stretch: 1 unless
        # gpu_comm_share > 0).
        self.multi_gpu_starts: list[tuple[int, int, bool, float]] = []

    def _green(self) -> dict[str, float | None]:
        """GreenScore and its terms over the run (module docstring); None before any energy."""
        e = self.energy_j
        if e <= 0 or self.it_j <= 0:
            return {"score": None, "pue_share": None, "renewable_share": None,
                    "efficiency": None}
        return {"score": self.green_j / e, "pue_share": self.it_j / e,
                "renewable_share": self.renewable_j / e, "efficiency": self.work_j / self.it_j}

    # ----------------------------------------------------------- event hooks
    def advance(self, t0: float, t1: float) -> None:
        """Integrate event-constant quantities over [t0, t1) (only after the warm-up)."""
        t0 = max(t0, self.measure_from)
        if t1 < t0:
            return
        if self.t_start is None:
            self.t_start = t0
        dt = t1 - t0
        self.t_last = t1
        if dt <= 0:
            return
        # int_on_cap, int_alloc, int_cap, int_be_alloc += their live value * dt
        self._integrals += self._live * dt
        self.int_on_nodes += self.on_nodes * dt
        self.int_pending_s += self.pending * dt
        self.int_pending_gpu_s += self.pending_gpu * dt
        self.int_pending_cls_s += self.pending_cls * dt
        rates = self._rates if t0 < self._rates_until else self._energy_rates(t0)
        energy_w, carbon_w, it_w, work_w, renewable_w, green_w = rates
        self.energy_j += energy_w * dt
        self.carbon_g += carbon_w * dt / 3.6e6  # W*s -> kWh, * g/kWh
        self.it_j += it_w * dt
        self.work_j += work_w * dt
        self.renewable_j += renewable_w * dt
        self.green_j += green_w * dt
        self.cost_usd += self.on_price_h * dt / 3600.0

    def _energy_rates(self, t: float) -> tuple[float, float, float, float, float, float]:
        """The per-second rates ``advance`` integrates, at ``t``: facility watts, watts x
        grid intensity, IT watts, work watts, renewable watts, GreenScore-weighted watts.

        They change only when the watts do (``tick``, ``power_changed``, which void the
        cache) or a site's carbon series steps (``CarbonSeries.held_until``), so an advance
        between events is a few multiplications (the same floats as computing them every
        time: the sums are the same expressions, evaluated once)."""
        it = self.on_idle_w_site + self.dyn_w_site
        watts = it * self.site_pue
        ci = np.array([c.at(t) for c in self.site_carbon])
        ren = np.array([c.renewable_at(t) for c in self.site_carbon])
        eff = np.divide(self.work_w_site, it, out=np.zeros_like(it), where=it > 0)
        self._rates = (float(watts.sum()), float((watts * ci).sum()), float(it.sum()),
                       float(self.work_w_site.sum()), float((watts * ren).sum()),
                       float((watts * green_score(self.site_pue_share, ren, eff)).sum()))
        self._rates_until = min((c.held_until(t) for c in self.site_carbon), default=np.inf)
        return self._rates

    def _void_rates(self) -> None:
        self._rates_until = -np.inf

    def bound(self, pod: int) -> None:
        tb = self.table
        self.pending -= 1
        self.pending_gpu -= float(tb.requests[pod, GPU])
        self.pending_cls[tb.cls[pod]] -= 1
        self.alloc_total += tb.charged[pod]
        self.be_alloc_total += tb.requests[pod, :2] - tb.charged[pod, :2]
        self.tenant_alloc[tb.tenant[pod]] += tb.requests[pod]

    def released(self, pod: int) -> None:
        tb = self.table
        self.alloc_total -= tb.charged[pod]
        self.be_alloc_total -= tb.requests[pod, :2] - tb.charged[pod, :2]
        self.tenant_alloc[tb.tenant[pod]] -= tb.requests[pod]

    def arrived(self, pod: int) -> None:
        self.tenant_seen[self.table.tenant[pod]] = True
        self.pending += 1
        self.pending_gpu += float(self.table.requests[pod, GPU])
        self.pending_cls[self.table.cls[pod]] += 1

    def requeued(self, pod: int) -> None:
        """A pod back in the queue (evicted)."""
        self.pending += 1
        self.pending_gpu += float(self.table.requests[pod, GPU])
        self.pending_cls[self.table.cls[pod]] += 1

    def evicted(self, pod: int) -> None:
        """A bound pod was taken off its node and is back in the queue (preempted, moved,
        or its node failed): counted after the warm-up, as preemptions and migrations are
        (an eviction while the cluster filled up is no figure of the measured window)."""
        self.requeued(pod)
        if self.t_last >= self.measure_from:
            self.evictions += 1

    def preempted(self, pod: int) -> None:
        """A pod was evicted to make room for a higher-priority one."""
        if self.t_last >= self.measure_from:
            self.preemptions_cls[self.table.cls[pod]] += 1

    def migrated(self, pod: int) -> None:
        """A pod was moved by a descheduling pass (evicted and bound elsewhere)."""
        if self.t_last >= self.measure_from:
            self.migrations_cls[self.table.cls[pod]] += 1

    def lost_work(self, pod: int, seconds: float) -> None:
        """An evicted pod lost ``seconds`` of running it will do again."""
        if self.t_last >= self.measure_from:
            self.lost_s_cls[self.table.cls[pod]] += seconds

    def multi_gpu_started(self, pod: int, sockets: int, fewest: int, nvlink: bool,
                          stretch: float) -> None:
        """A multi-GPU pod started on devices spanning ``sockets`` NUMA sockets."""
        if self.t_last >= self.measure_from:
            self.multi_gpu_starts.append((sockets, fewest, nvlink, stretch))

    def _device_locality(self) -> dict[str, float] | None:
        """The multi-GPU starts' figures (None: no multi-GPU pod started)."""
        if not self.multi_gpu_starts:
            return None
        a = np.asarray(self.multi_gpu_starts, dtype=np.float64)
        cross = a[:, 0] > 1
        # Crossings that slow the pod: one socket could have held its devices, and no
        # NVLink mesh joins them (what ``locality_stretch`` charges).
        costly = cross & (a[:, 1] <= 1) & (a[:, 2] == 0)
        return {"multi_gpu_starts": int(a.shape[0]),
                "cross_socket_pct": float(100 * cross.mean()),
                "costly_cross_socket_pct": float(100 * costly.mean()),
                "stretch_mean": float(a[:, 3].mean()),
                "stretch_p95": float(np.percentile(a[:, 3], 95)),
                "stretch_std": float(a[:, 3].std())}

    def node_failed(self, node: int, now: float) -> None:
        self.failure_log.append((now, node))
        if now >= self.measure_from:
            self.node_failures += 1

    def down(self, pod: int, since: float, until: float) -> None:
        """Pod ``pod`` was down (stopped against its will) from ``since`` to ``until``."""
        self.downtime_cls[self.table.cls[pod]] += max(until - max(since, self.measure_from), 0.0)

    def replaced(self, pod: int, failed_at: float, bound_at: float | None, now: float) -> None:
        """A pod stopped by its node's failure at ``failed_at`` runs again."""
        if failed_at >= self.measure_from:
            to_bound = np.nan if bound_at is None else bound_at - failed_at
            self.replacements.append((int(self.table.cls[pod]), to_bound, now - failed_at))

    def failed(self, pods: list[int]) -> None:
        """Pods that left the queue without running (fill mode)."""
        self.pending -= len(pods)
        self.pending_gpu -= float(self.table.requests[pods, GPU].sum())
        np.subtract.at(self.pending_cls, self.table.cls[pods], 1)

    def snapshot(self) -> dict[str, float]:
        """Cumulative totals so far: the step-wise reward is built from their differences.

        ``alloc_*_frac_s``: allocated share of capacity x seconds; ``pending_s`` and
        ``contended_s``: pod-seconds waiting / online pod-seconds in contention;
        ``contended_share_s`` / ``cross_zone_share_s``: seconds x the share of online pods
        in contention / of app traffic crossing zones (the latter only when tracked);
        ``pending_s.<class>``: pod-seconds waiting, per workload class;
        ``gpu_alloc_frac``: allocated share of GPU now (fill mode has no time).
        """
        cap = np.maximum(self.capacity_total, 1)
        return {
            "time_s": self.t_last,
            "alloc_cpu_frac_s": float(self.int_alloc[CPU] / cap[CPU]),
            "alloc_gpu_frac_s": float(self.int_alloc[GPU] / cap[GPU]),
            "gpu_alloc_frac": float(self.alloc_total[GPU] / cap[GPU]),
            "cpu_alloc_frac": float(self.alloc_total[CPU] / cap[CPU]),
            "pending_s": self.int_pending_s,
            "pending_gpu_frac_s": float(self.int_pending_gpu_s / cap[GPU]),
            **dict(zip(_PENDING_KEYS, self.int_pending_cls_s.tolist(), strict=True)),
            "contended_s": self.online_contended_pod_s,
            "contended_share_s": self.contended_share_s,
            "cross_zone_share_s": self.cross_zone_share_s,
            "energy_j": self.energy_j,
            "cost_usd": self.cost_usd,
            "carbon_g": self.carbon_g,
            "jain": self.fairness[-1] if self.fairness else 1.0,
        }

    def power_changed(self, node: int, old: int, new: int) -> None:
        was_on, is_on = old != POWER_OFF, new != POWER_OFF
        if was_on == is_on:
            return
        sign = 1.0 if is_on else -1.0
        self.on_capacity += sign * self.state.capacity[node]
        self.on_nodes += int(sign)
        self.on_idle_w_site[self.state.site_id[node]] += sign * self.node_idle_w[node]
        self.on_price_h += sign * self.node_price_h[node]
        self._void_rates()

    def rejected(self, rejections: Sequence[Rejection]) -> None:
        """Count a rejection under each of its reasons (and each plugin that gave one), after
        the warm-up only (nothing before it counts)."""
        if self.t_last < self.measure_from:
            return
        for r in rejections or (Rejection("unschedulable"),):
            self.rejections[r.reason] = self.rejections.get(r.reason, 0) + 1
            if r.plugin:
                self.rejections_by_plugin[r.plugin] = self.rejections_by_plugin.get(r.plugin, 0) + 1

    # ------------------------------------------------------------------ ticks
    def tick(self, t: float, dt: float, queue_length: int, use: RunningUse,
             extra: dict[str, float]) -> None:
        """Read the usage sample ``use`` (just taken by the engine) and the state at ``t``;
        ``dt`` is the span this sample stands for. Changes nothing in the state."""
        st, tb = self.state, self.table
        run, be_demand, be_got = use.pods, use.be_demand, use.be_got
        hp_cpu_mem = use.hp[:, :2]
        cap = st.capacity
        cpu_util = np.minimum(st.usage[:, 0] / cap[:, CPU], 1.0)
        gpu_util = np.minimum(st.usage[:, 2] / np.maximum(cap[:, GPU], 1), 1.0)
        dyn = self.power_model.dynamic_w(st.power, cpu_util, gpu_util)
        self.dyn_w_site = np.bincount(st.site_id, dyn, minlength=self.dyn_w_site.size)
        pm = self.power_model
        dyn_max = pm.host_dyn_w + pm.gpu_dyn_w
        node_use = np.divide(dyn, dyn_max, out=np.zeros_like(dyn), where=dyn_max > 0)
        self.work_w_site = np.bincount(st.site_id, node_use * pm.max_w,
                                       minlength=self.work_w_site.size)
        self._void_rates()
        usage_sum = np.minimum(st.usage, self._usage_cap).sum(axis=0)
        if t < self.measure_from or dt <= 0:
            return  # warm-up (or the instant at the horizon): keep power current only
        if self.full:
            self._pod_carbon(use, cpu_util, gpu_util, t, dt)
        self.int_usage += usage_sum * dt
        self.int_on_cap_usage += self.on_capacity[list(USAGE_RES)] * dt
        self.int_usage_time += dt
        self.be_demand_cpu_s += float(be_demand[:, 0].sum()) * dt
        self.be_throttled_cpu_s += float((be_demand[:, 0] - be_got[:, 0]).sum()) * dt

        # Contention: online pods on nodes whose actual use exceeds capacity.
        over = (hp_cpu_mem[:, 0] > cap[:, CPU]) | (hp_cpu_mem[:, 1] > cap[:, MEM])
        online = run[tb.cls[run] == _ONLINE]
        self.online_pod_s += online.size * dt
        hit = online[over[tb.node[online]]]
        self.online_contended_pod_s += hit.size * dt
        if online.size:
            self.contended_share_s += hit.size / online.size * dt
        if self.full:
            self.contended_pods.update(hit.tolist())

        # Fairness: Jain's index over tenants' dominant shares.
        seen = self.tenant_seen
        if seen.any():
            share = (self.tenant_alloc[seen] / np.maximum(self.capacity_total, 1)).max(axis=1)
            sq = float((share**2).sum())
            self.fairness.append(float(share.sum() ** 2 / (seen.sum() * sq)) if sq > 0 else 1.0)
        cz = self._cross_zone(run, dt) if self.track_traffic else 0.0
        if not self.full:
            return  # what follows is the report's alone
        self.cross_zone.append(cz)

        frag_total, frag_idle = cluster_fragmentation(st, self.target)
        self.frag.append(frag_total)
        pct = 100.0 / np.maximum(self.capacity_total, 1)
        on_pct = 100.0 / np.maximum(self.on_capacity, 1)
        row = {
            "time_s": t,
            "alloc_cpu_pct": self.alloc_total[CPU] * pct[CPU],
            "alloc_mem_pct": self.alloc_total[MEM] * pct[MEM],
            "alloc_gpu_pct": self.alloc_total[GPU] * pct[GPU],
            "alloc_cpu_on_pct": self.alloc_total[CPU] * on_pct[CPU],
            "alloc_gpu_on_pct": self.alloc_total[GPU] * on_pct[GPU],
            "usage_cpu_pct": usage_sum[0] * pct[CPU],
            "usage_mem_pct": usage_sum[1] * pct[MEM],
            "usage_gpu_pct": usage_sum[2] * pct[GPU],
            "usage_cpu_on_pct": usage_sum[0] * on_pct[CPU],
            "powered_on_nodes": float(self.on_nodes),
            "running_pods": float(run.size),
            "queue_length": float(queue_length),
            "power_kw": float(((self.on_idle_w_site + self.dyn_w_site) * self.site_pue).sum())
            / 1000,
            "gpu_frag_pct": frag_total,
            "gpu_frag_idle_pct": frag_idle,
            "cross_zone_gb_per_h": cz,
            **extra,
        }
        self.rows.append(row)

    def _cross_zone(self, run: np.ndarray, dt: float) -> float:
        """Cross-zone traffic between running pods of one app now (GB/h); integrates the
        share of all such pods' traffic that crosses zones for the reward."""
        st, tb = self.state, self.table
        with_app = run[tb.app[run] >= 0]
        if not with_app.size:
            return 0.0
        apps, zones = tb.app[with_app], st.zone_id[tb.node[with_app]]
        n_zone = len(st.zone_names)
        key = apps * n_zone + zones
        per_key = np.bincount(key, minlength=(apps.max() + 1) * n_zone)
        per_app = np.bincount(apps)
        peers = per_app[apps] - 1
        other = per_app[apps] - per_key[key]
        share = np.divide(other, peers, out=np.zeros(peers.size), where=peers > 0)
        traffic = tb.traffic_mbps[with_app]
        crossing = float((traffic * share).sum())
        with_peers = float(traffic[peers > 0].sum())
        if with_peers > 0:
            self.cross_zone_share_s += crossing / with_peers * dt
        return crossing * 3600 / 8 / 1000  # Mb/s -> GB/h

    # ----------------------------------------------------------------- report
    def report(self, mode: str, fill_curve: list[tuple[float, float]]) -> dict[str, Any]:
        """All metrics as a JSON-ready dict (percentages in 0..100)."""
        if not self.full:
            raise ValidationError("report_metrics", "this run kept only the step reward's "
                                  "metrics (report_metrics: false); it has no report")
        tb, st = self.table, self.state
        span = max(self.t_last - (self.t_start or 0.0), 0.0)

        def ratio(num: np.ndarray | float, den: np.ndarray | float) -> Any:
            return np.divide(num, den, out=np.zeros_like(np.asarray(num, float)),
                             where=np.asarray(den) > 0) * 100

        names = ("cpu", "memory", "gpu")
        if span > 0:
            alloc = ratio(self.int_alloc, self.int_cap)
            alloc_on = ratio(self.int_alloc, self.int_on_cap)
            usage_avg = self.int_usage / max(self.int_usage_time, 1e-9)
            usage_on = ratio(self.int_usage, self.int_on_cap_usage)
        else:  # fill mode: no time passes, report the final snapshot
            alloc = ratio(self.alloc_total, self.capacity_total)
            alloc_on = ratio(self.alloc_total, self.on_capacity)
            usage_avg = np.minimum(st.usage, self._usage_cap).sum(axis=0)
            usage_on = ratio(usage_avg, self.on_capacity[list(USAGE_RES)])
        usage = ratio(usage_avg, self.capacity_total[list(USAGE_RES)])
        final_gpu_alloc = float(ratio(self.alloc_total[GPU], self.capacity_total[GPU]))
        gpu_rate = final_gpu_alloc if mode == "fill" else float(alloc[GPU])

        per_class: dict[str, Any] = {}
        measured = tb.arrival >= self.measure_from
        for ci, cls in enumerate(POD_CLASSES):
            sel = (tb.cls == ci) & measured
            arrived = sel & (tb.status != 0)
            if not arrived.any():
                continue
            sched = arrived & np.isfinite(tb.scheduled_at)
            started = arrived & np.isfinite(tb.started_at)
            q = tb.scheduled_at[sched] - tb.arrival[sched]
            s = tb.started_at[started] - tb.arrival[started]
            waiting = arrived & (tb.status == PENDING)
            pulled = arrived & np.isfinite(tb.pull_s)
            # Censoring-safe: pods still waiting at the end count the time they waited so far.
            wait_h = (q.sum() + (self.t_last - tb.arrival[waiting]).sum()) / 3600.0
            per_class[cls.value] = {
                "arrived": int(arrived.sum()),
                "placed": int(sched.sum()),
                "failed": int((arrived & (tb.status == FAILED)).sum()),
                "pending_at_end": int(waiting.sum()),
                "waiting_pod_hours": float(wait_h),
                "preemptions": int(self.preemptions_cls[ci]),
                "migrations": int(self.migrations_cls[ci]),
                "lost_pod_hours": float(self.lost_s_cls[ci] / 3600.0),
                "image_pull_s": _percentiles(tb.pull_s[pulled]),
                "queueing_delay_s": _percentiles(q),
                "start_latency_s": _percentiles(s),
                # Censoring-safe: a pod not started by the end counts what it waited so
                # far (a lower bound), so a scheduler that never starts a gang does not
                # look faster than one that starts it late.
                "start_latency_all_s": _percentiles(np.concatenate([
                    s, self.t_last - tb.arrival[arrived & ~np.isfinite(tb.started_at)
                                                & (tb.status != FAILED)]])),
            }
        avail = self._availability()
        for name, a in avail.items():
            if name in per_class:
                per_class[name]["availability_pct"] = a["availability_pct"]
                per_class[name]["downtime_s"] = a["downtime_s"]
                per_class[name]["lifetime_s"] = a["lifetime_s"]
        lat = np.flatnonzero(np.isfinite(tb.latency_ms) & measured)
        slo = np.array([
            np.inf if tb.pods[i].latency_slo_ms is None else tb.pods[i].latency_slo_ms
            for i in lat
        ])
        over = tb.latency_ms[lat] > slo
        lat_viol = int(over.sum())
        too_far = int((over & tb.room_within_slo[lat]).sum())
        # Of every latency-bound pod that arrived in the window, the share that started
        # within its SLO (one still waiting, or failed, counts as missed).
        came = np.flatnonzero(measured & (tb.status != 0))
        bound = came[np.array([tb.pods[i].latency_slo_ms is not None for i in came],
                              dtype=bool)] if came.size else came
        within = int((np.isfinite(slo) & ~over).sum())
        within_pct = 100.0 * within / bound.size if bound.size else None
        dec = np.array(self.decision_seconds)
        metrics: dict[str, Any] = {
            "gpu_allocation_rate": gpu_rate,
            "gpu_allocation_final": final_gpu_alloc,
            "allocation_pct": dict(zip(names, map(float, alloc[list(USAGE_RES)]), strict=True)),
            "allocation_on_pct": dict(
                zip(names, map(float, alloc_on[list(USAGE_RES)]), strict=True)
            ),
            "usage_pct": dict(zip(names, map(float, usage), strict=True)),
            "usage_on_pct": dict(zip(names, map(float, usage_on), strict=True)),
            "best_effort": {
                "cpu_requested_pct": float(
                    ratio(self.int_be_alloc[0], self.int_cap[CPU]) if span > 0
                    else ratio(self.be_alloc_total[0], self.capacity_total[CPU])
                ),
                "cpu_throttled_pct": float(ratio(self.be_throttled_cpu_s, self.be_demand_cpu_s)),
            },
            "gpu_fragmentation_pct": float(np.mean(self.frag)) if self.frag else 0.0,
            "gpu_fragmentation_final_pct": self.frag[-1] if self.frag else 0.0,
            "powered_on_nodes_avg": self.int_on_nodes / span if span > 0 else float(
                self.on_nodes
            ),
            "classes": per_class,
            "slo": {
                "online_contended_time_pct": float(
                    ratio(self.online_contended_pod_s, self.online_pod_s)
                ),
                "online_pods_contended": len(self.contended_pods),
                "latency_pods": int(lat.size),
                "latency_violations": lat_viol,
                # ... split by cause: a node within the SLO had room (placed too far), or
                # none had (no room within the SLO).
                "latency_violations_placed_too_far": too_far,
                "latency_violations_no_room": lat_viol - too_far,
                "latency_pods_arrived": int(bound.size),
                "latency_within_slo_pct": within_pct,
                "online_availability_pct": avail.get(PodClass.ONLINE.value, {}).get(
                    "availability_pct"),
            },
            "availability": avail,
            "failures": self._failures(),
            "batch_runs": self._batch_runs(),
            "images": {
                # Seconds from binding to the container's start (pull, then start) of the
                # pods with an image, and what the pulls downloaded.
                "pull_s": _percentiles(tb.pull_s[np.isfinite(tb.pull_s) & measured]),
                "pulled_gib": float(tb.pulled_mib[measured].sum() / 1024.0),
            },
            "cross_zone_gb_per_h": float(np.mean(self.cross_zone)) if self.cross_zone else 0.0,
            "energy_kwh": self.energy_j / 3.6e6,
            "carbon_kg": self.carbon_g / 1000,
            "green": self._green(),
            # The pods' own work (see the module docstring), per class, after the warm-up.
            "pod_carbon_kg": {
                cls.value: float(tb.carbon_g[tb.cls == ci].sum() / 1000)
                for ci, cls in enumerate(POD_CLASSES) if (tb.cls == ci).any()},
            "cost_usd": self.cost_usd,
            "fairness_jain": float(np.mean(self.fairness)) if self.fairness else 1.0,
            "pods": {
                "total": len(tb),
                "arrived": int(((tb.status != 0) & measured).sum()),
                "placed": int((np.isfinite(tb.scheduled_at) & measured).sum()),
                "running_at_end": int(
                    (((tb.status == RUNNING) | (tb.status == BOUND)) & measured).sum()
                ),
                "completed": int(((tb.status == DONE) & measured).sum()),
                "failed": int(((tb.status == FAILED) & measured).sum()),
                "pending_at_end": int(((tb.status == PENDING) & measured).sum()),
                "waiting_pod_hours": float(sum(c["waiting_pod_hours"]
                                               for c in per_class.values())),
                "evictions": self.evictions,
                "preemptions": int(self.preemptions_cls.sum()),
                "migrations": int(self.migrations_cls.sum()),
                "lost_pod_hours": float(self.lost_s_cls.sum() / 3600.0),
                "deadline_missed": self._deadline_missed(measured),
            },
            "device_locality": self._device_locality(),
            "rejections_by_reason": dict(sorted(self.rejections.items())),
            "rejections_by_plugin": dict(sorted(self.rejections_by_plugin.items())),
            "decision_latency_us": {
                "p50": float(np.percentile(dec, 50) * 1e6) if dec.size else 0.0,
                "p99": float(np.percentile(dec, 99) * 1e6) if dec.size else 0.0,
            },
            "decisions_per_second": float(dec.size / dec.sum()) if dec.sum() > 0 else 0.0,
            "simulated_hours": span / 3600,
            "warmup_hours": self.measure_from / 3600,
        }
        if mode == "fill":
            metrics["gpu_allocation_curve"] = [
                {"arrived_gpu_pct": a, "gpu_allocation_pct": b} for a, b in fill_curve
            ]
        return metrics


    def _pod_carbon(self, use: RunningUse, cpu_util: np.ndarray, gpu_util: np.ndarray,
                    t: float, dt: float) -> None:
        """Charge each running pod its share of its node's dynamic watts over ``dt``."""
        run = use.pods
        if run.size == 0:
            return
        st, tb, pn = self.state, self.table, use.nodes
        cpu = tb.requests[run, CPU] * use.factor
        if use.best_effort.any():  # best-effort pods get what is left (throttled)
            got = np.divide(use.be_got[:, 0], use.be_demand[:, 0],
                            out=np.zeros(st.num_nodes), where=use.be_demand[:, 0] > 0)
            cpu = np.where(use.best_effort, cpu * got[pn], cpu)
        gpu = np.where(use.best_effort, 0.0, tb.requests[run, GPU] * use.factor)
        pm = self.power_model
        on = st.power[pn] == POWER_ON
        host_w = (pm.host_dyn_w * cpu_util)[pn]
        gpu_w = (pm.gpu_dyn_w * gpu_util)[pn]
        node_cpu, node_gpu = st.usage[pn, 0], st.usage[pn, 2]
        w = host_w * np.divide(cpu, node_cpu, out=np.zeros(run.size), where=node_cpu > 0) \
            + gpu_w * np.divide(gpu, node_gpu, out=np.zeros(run.size), where=node_gpu > 0)
        site = st.site_id[pn]
        ci = np.array([c.at(t) for c in self.site_carbon])
        grams = np.where(on, w, 0.0) * self.site_pue[site] * ci[site] * dt / 3.6e6
        np.add.at(tb.carbon_g, run, grams)

    def _availability(self) -> dict[str, dict[str, float | None]]:
        """Per class: share of the time from first start to end that pods ran."""
        tb, end = self.table, self.t_last
        started = np.isfinite(tb.started_at)
        stop = np.where(np.isfinite(tb.finished_at), tb.finished_at, end)
        life = np.clip(stop - np.maximum(tb.started_at, self.measure_from), 0.0, None)
        open_down = np.isfinite(tb.down_from)  # down at the end
        still = np.clip(end - np.maximum(tb.down_from, self.measure_from), 0.0, None)
        out: dict[str, dict[str, float | None]] = {}
        for ci, cls in enumerate(POD_CLASSES):
            sel = started & (tb.cls == ci)
            if not sel.any():
                continue
            total = float(life[sel].sum())
            down = float(self.downtime_cls[ci] + still[sel & open_down].sum())
            out[cls.value] = {
                "availability_pct": None if total <= 0 else 100.0 * (1.0 - down / total),
                "downtime_s": down,
                "lifetime_s": total,
            }
        return out

    def _failures(self) -> dict[str, Any]:
        """Node failures after the warm-up and how fast their pods ran again."""
        tb, end = self.table, self.t_last
        rows = np.array(self.replacements, dtype=np.float64).reshape(-1, 3)
        waiting = np.isfinite(tb.failed_at) & (tb.failed_at >= self.measure_from)

        def figures(sel: np.ndarray, wait: np.ndarray) -> dict[str, Any]:
            r = rows[sel]
            bound = r[:, 1][np.isfinite(r[:, 1])]
            return {
                "pods_stopped": int(sel.sum() + wait.sum()),
                "to_bound_s": _percentiles(bound),
                "to_running_s": _percentiles(r[:, 2]),
                "to_running_all_s": _percentiles(np.concatenate(
                    [r[:, 2], end - tb.failed_at[wait]])),
                "restarted_in_place": int((~np.isfinite(r[:, 1])).sum()),
                "max_to_running_s": float(np.concatenate(
                    [r[:, 2], end - tb.failed_at[wait]]).max(initial=0.0)),
                "not_running_at_end": int(wait.sum()),
            }

        out: dict[str, Any] = {"node_failures": self.node_failures,
                               **figures(np.ones(len(rows), bool), waiting)}
        out["classes"] = {
            cls.value: figures(rows[:, 0] == ci, waiting & (tb.cls == ci))
            for ci, cls in enumerate(POD_CLASSES)
            if (rows[:, 0] == ci).any() or (waiting & (tb.cls == ci)).any()
        }
        return out

    def _batch_runs(self) -> dict[str, Any]:
        """Batch pods grouped by app: each group's window (first arrival -> last finish)."""
        tb, end = self.table, self.t_last
        sel = (tb.cls == POD_CLASS_IDS[PodClass.BATCH]) & (tb.app >= 0) & (tb.status != NOT_ARRIVED)
        runs = []
        for a in np.unique(tb.app[sel]):
            m = sel & (tb.app == a)
            first = float(tb.arrival[m].min())
            if first < self.measure_from:
                continue
            done = bool((tb.status[m] == DONE).all())
            last = float(tb.finished_at[m].max()) if done else end
            runs.append({"app": tb.apps[a], "pods": int(m.sum()), "complete": done,
                         "window_h": (last - first) / 3600.0,
                         "deadline_missed": self._deadline_missed(m)})
        hours = np.array([r["window_h"] for r in runs])
        return {
            "runs": len(runs),
            "incomplete": sum(not r["complete"] for r in runs),
            "window_h_mean": float(hours.mean()) if hours.size else None,
            "window_h_max": float(hours.max()) if hours.size else None,
            "deadline_missed": sum(r["deadline_missed"] for r in runs),
            "each": runs,
        }

    def _deadline_missed(self, sel: np.ndarray) -> int:
        """Pods of ``sel`` with a deadline that finished after it, or had not finished
        when it passed."""
        tb = self.table
        dl = sel & np.isfinite(tb.deadline)
        fin = tb.finished_at
        late = np.where(np.isfinite(fin), fin > tb.deadline, self.t_last > tb.deadline)
        return int((dl & late).sum())


def _percentiles(x: np.ndarray) -> dict[str, float | None]:
    """p50/p95/p99/mean of ``x``; None for an empty set (no pod to measure is not 0 s)."""
    if x.size == 0:
        return {"p50": None, "p95": None, "p99": None, "mean": None}
    p = np.percentile(x, [50, 95, 99])
    return {"p50": float(p[0]), "p95": float(p[1]), "p99": float(p[2]), "mean": float(x.mean())}
