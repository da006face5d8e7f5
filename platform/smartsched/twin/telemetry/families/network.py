"""Network: bytes, packets, drops and errors per NIC, packet latency, TCP.

One NIC per socket (the node topology), 100 Gb/s, 10 Gb/s at edge sites.
Each pod sends and receives on one NIC, chosen by a seeded hash of the pod:

    traffic  = traffic_mbps * (use factor / max(mean use, 0.05))       bytes/s
    sent     = traffic * tx share of its class (services send more than they
               receive), received = the rest
    baseline = (50 kB/s + 20 kB/s * pods) / NICs each way (powered)
    carried  = min(offered, link speed); packets = carried / 900 B
    drops    = packets * 2 % * saturation_loss(offered / speed)  (0 below 85 %
               link use, quadratic to 2 % at full) + offered beyond the link / 900 B
    errors   = 1e-9 per packet
    latency  = (20 us p50, 150 us p99) * (1 + u/(1-u)) * (1 + 0.5 * cpu util^2),
               u = max(rx, tx) / speed capped at 0.98
    TCP      out segments = 95 % of packets sent; retransmits = out segments *
             (2e-4 + drops / packets); established = 30 + 40 per online or
             edge pod + 4 per other pod (powered)
"""

from __future__ import annotations

from typing import Final

import numpy as np

from smartsched.model.pod import POD_CLASS_IDS, POD_CLASSES, PodClass
from smartsched.model.topology import NIC_GBPS
from smartsched.twin.telemetry import physics as ph
from smartsched.twin.telemetry.families.base import Columns, slot_mask
from smartsched.twin.usage import _hash01

CLOUD_NIC_BPS: Final = NIC_GBPS * 1e9
EDGE_NIC_BPS: Final = 1.25e9
MEAN_PACKET_BYTES: Final = 900.0
NODE_BASE_TRAFFIC_BPS: Final = 50e3
POD_BASE_TRAFFIC_BPS: Final = 20e3
PACKET_LATENCY_BASE_S: Final = np.array([20e-6, 150e-6])  # catalogue.QUANTILES
DROP_MAX: Final = 0.02
DROP_ONSET: Final = 0.85
ERRORS_PER_PACKET: Final = 1e-9
NIC_HASH_SALT: Final = 2
# Share of a pod's traffic it sends, by class (services answer more than they are asked).
TX_SHARE: Final = {PodClass.ONLINE: 0.6, PodClass.BATCH: 0.3, PodClass.AI_TRAIN: 0.5,
                   PodClass.AI_INFER: 0.6, PodClass.EDGE_RT: 0.6}
_TX_SHARE_BY_ID: Final = np.array([TX_SHARE[c] for c in POD_CLASSES])  # by class id
_CHATTY = (POD_CLASS_IDS[PodClass.ONLINE], POD_CLASS_IDS[PodClass.EDGE_RT])


def pod_nics(index: np.ndarray, node: np.ndarray, nics: np.ndarray, seed: int) -> np.ndarray:
    """[P] the NIC each pod talks through: a seeded hash of the pod over its node's NICs."""
    k = nics[node]
    h = _hash01(index, np.full(index.size, NIC_HASH_SALT), seed)
    return np.minimum((h * k).astype(np.int64), k - 1)


def pod_traffic_bps(traffic_mbps: np.ndarray, factor: np.ndarray,
                    usage_mean: np.ndarray) -> np.ndarray:
    """[P] bytes/s a pod moves now: its mean traffic scaled by its use over its mean use."""
    return traffic_mbps * 1e6 / 8.0 * factor / np.maximum(usage_mean, 0.05)


def packets_per_second(cols: Columns) -> np.ndarray:
    """[N] packets received and sent over all NICs, from ``network_family``'s columns."""
    return (cols["node_network_receive_packets_total"]
            + cols["node_network_transmit_packets_total"]).sum(axis=1)


def network_family(*, index: np.ndarray, node: np.ndarray, cls: np.ndarray,
                   traffic_bps: np.ndarray, nics: np.ndarray, nic_bps: np.ndarray,
                   powered: np.ndarray, pods_n: np.ndarray, pods_cls: np.ndarray,
                   cpu_util: np.ndarray, slots: int, seed: int) -> Columns:
    """The network columns: [N, slots] per NIC ([N, slots, quantiles] latency), TCP per node.

    Per pod [P]: ``index`` (hash key), ``node``, ``cls`` (class id), ``traffic_bps``
    (``pod_traffic_bps``). Per node [N]: ``nics`` count, ``nic_bps`` link speed
    (bytes/s), ``powered`` (1.0 unless off), ``pods_n``, ``pods_cls`` [N, classes]
    pod counts, ``cpu_util`` 0..1.
    """
    n, k, pw = powered.size, slots, powered
    tx_pod = traffic_bps * _TX_SHARE_BY_ID[cls]
    key = node * k + pod_nics(index, node, nics, seed)
    base = (pw * (NODE_BASE_TRAFFIC_BPS + POD_BASE_TRAFFIC_BPS * pods_n) / nics)[:, None]
    base = np.where(slot_mask(nics, k), base, 0.0)
    tx = np.bincount(key, tx_pod, minlength=n * k).reshape(n, k) + base
    rx = np.bincount(key, traffic_bps - tx_pod, minlength=n * k).reshape(n, k) + base
    speed = nic_bps[:, None]
    rx_ok, tx_ok = np.minimum(rx, speed), np.minimum(tx, speed)
    u_rx, u_tx = rx / speed, tx / speed
    prx, ptx = rx_ok / MEAN_PACKET_BYTES, tx_ok / MEAN_PACKET_BYTES
    drx = (prx * DROP_MAX * ph.saturation_loss(u_rx, DROP_ONSET)
           + (rx - rx_ok) / MEAN_PACKET_BYTES)
    dtx = (ptx * DROP_MAX * ph.saturation_loss(u_tx, DROP_ONSET)
           + (tx - tx_ok) / MEAN_PACKET_BYTES)
    lat = PACKET_LATENCY_BASE_S[None, None, :] * (
        ph.queueing_factor(np.maximum(u_rx, u_tx))
        * (1.0 + 0.5 * cpu_util[:, None] ** 2))[:, :, None]
    pkts = (prx + ptx).sum(axis=1)
    drop_frac = np.where(pkts > 0, (drx + dtx).sum(axis=1) / np.where(pkts > 0, pkts, 1.0), 0.0)
    out_segs = 0.95 * ptx.sum(axis=1)
    chatty = pods_cls[:, _CHATTY[0]] + pods_cls[:, _CHATTY[1]]
    return {
        "node_network_receive_bytes_total": rx_ok,
        "node_network_transmit_bytes_total": tx_ok,
        "node_network_receive_packets_total": prx,
        "node_network_transmit_packets_total": ptx,
        "node_network_receive_drop_total": drx,
        "node_network_transmit_drop_total": dtx,
        "node_network_receive_errs_total": ERRORS_PER_PACKET * prx,
        "node_network_transmit_errs_total": ERRORS_PER_PACKET * ptx,
        "node_network_speed_bytes": np.broadcast_to(speed, (n, k)),
        "smartsched_node_network_packet_latency_seconds": lat,
        "node_netstat_Tcp_OutSegs": out_segs,
        "node_netstat_Tcp_RetransSegs": out_segs * (2e-4 + drop_frac),
        "node_netstat_Tcp_CurrEstab": pw * (30.0 + 40.0 * chatty + 4.0 * (pods_n - chatty)),
    }
