"""Device locality in the twin: a multi-GPU pod whose devices span NUMA sockets its node
did not need to runs longer (EngineConfig.gpu_comm_share), the report counts such starts,
and with the share at 0 nothing about a run changes."""

from __future__ import annotations

import pytest

from smartsched.model.errors import ValidationError
from smartsched.model.pod import PodClass
from smartsched.model.topology import LOCAL_NUMA, REMOTE_NUMA, fewest_sockets, locality_stretch
from smartsched.twin.decision import Decision
from smartsched.twin.engine import Engine, EngineConfig
from smartsched.twin.podtable import DONE
from tests.builders import cluster, node, pod

CROSS = REMOTE_NUMA / LOCAL_NUMA  # 2.1: the inter-socket path's cost


def test_fewest_sockets() -> None:
    assert fewest_sockets([2, 2], 1) == 1
    assert fewest_sockets([2, 2], 2) == 1
    assert fewest_sockets([2, 2], 3) == 2
    assert fewest_sockets([1, 3], 3) == 1
    assert fewest_sockets([4, 4], 8) == 2
    assert fewest_sockets([2, 2], 5) == 0  # does not fit


@pytest.mark.parametrize(("used", "fewest", "nvlink", "share", "want"), [
    (1, 1, False, 0.3, 1.0),                          # one socket: nothing crosses
    (2, 1, False, 0.3, 0.7 + 0.3 * CROSS),            # crosses when one socket would do
    (3, 1, False, 0.5, 0.5 + 0.5 * CROSS),            # the slowest path counts, once
    (2, 2, False, 0.3, 1.0),                          # must cross anyway: no stretch
    (2, 1, True, 0.3, 1.0),                           # NVLink mesh: every pair is near
    (2, 1, False, 0.0, 1.0),                          # the twin's default: no locality
    (2, 1, False, 1.0, CROSS),
])
def test_locality_stretch(used: int, fewest: int, nvlink: bool, share: float,
                          want: float) -> None:
    assert locality_stretch(used, fewest, nvlink, share) == pytest.approx(want)


def _run(share: float, devices: tuple[int, ...], model: str = "T4") -> Engine:
    """One 4-GPU node (GPUs 0-1 on socket 0, 2-3 on socket 1); a 2-GPU training pod of
    1,000 s bound to ``devices``; the run to the end."""
    spec = cluster(node("g", cpu=64000, mem=262144, gpus=4, model=model))
    train = pod("t", gpu_milli=1000, num_gpu=2, duration=1000.0, pod_class=PodClass.AI_TRAIN)
    e = Engine(spec, [train], EngineConfig(power_management=False, gpu_comm_share=share))
    while e.next_decision() is not None:
        e.apply(Decision(0, devices))
    return e


def test_a_pod_spanning_sockets_runs_longer_by_the_stretch() -> None:
    near = _run(0.3, (0, 1))
    far = _run(0.3, (1, 2))
    assert near.table.status[0] == DONE and far.table.status[0] == DONE
    assert near.table.finished_at[0] == pytest.approx(1000.0)
    assert far.table.finished_at[0] == pytest.approx(1000.0 * (0.7 + 0.3 * CROSS))
    loc = far.metrics.report("replay", [])["device_locality"]
    assert loc["multi_gpu_starts"] == 1
    assert loc["cross_socket_pct"] == 100.0 and loc["costly_cross_socket_pct"] == 100.0
    assert loc["stretch_mean"] == pytest.approx(0.7 + 0.3 * CROSS)
    near_loc = near.metrics.report("replay", [])["device_locality"]
    assert near_loc["cross_socket_pct"] == 0.0 and near_loc["stretch_mean"] == 1.0


def test_no_stretch_over_nvlink_or_at_the_default_share() -> None:
    nv = _run(0.3, (1, 2), model="A100")
    assert nv.table.finished_at[0] == pytest.approx(1000.0)
    loc = nv.metrics.report("replay", [])["device_locality"]
    assert loc["cross_socket_pct"] == 100.0 and loc["costly_cross_socket_pct"] == 0.0
    default = _run(0.0, (1, 2))
    assert default.table.finished_at[0] == 1000.0  # exactly: run times as given
    loc = default.metrics.report("replay", [])["device_locality"]
    assert loc["costly_cross_socket_pct"] == 100.0 and loc["stretch_mean"] == 1.0


def test_evicted_stretched_pod_keeps_its_checkpoints_in_work_not_wall_time() -> None:
    # A stretched run of 1.33x: 900 s of wall time is ~677 s of work; with checkpoints
    # every 300 s of work it keeps 600 s and has 400 s left, wherever it goes next.
    spec = cluster(node("g", cpu=64000, mem=262144, gpus=4, model="T4"))
    train = pod("t", gpu_milli=1000, num_gpu=2, duration=1000.0, pod_class=PodClass.AI_TRAIN,
                checkpoint_interval_s=300.0)
    e = Engine(spec, [train], EngineConfig(power_management=False, gpu_comm_share=0.3))
    assert e.next_decision() is not None
    e.apply(Decision(0, (1, 2)))
    e._advance(900.0)
    e._lose_work(0)
    assert e.table.remaining[0] == pytest.approx(400.0)
    stretch = 0.7 + 0.3 * CROSS
    lost = e.metrics.lost_s_cls.sum()
    assert lost == pytest.approx(900.0 - 600.0 * stretch)


def test_bad_share_names_the_field() -> None:
    for bad in (-0.1, 1.5, float("nan"), True):
        with pytest.raises(ValidationError, match="gpu_comm_share"):
            EngineConfig(gpu_comm_share=bad)
