"""Default usage profiles per pod class.

Owns how much of its request a pod actually uses when a trace does not say:
online services follow the day, batch and training run flat and high,
inference is bursty. The twin turns these into node usage; placement cannot
change them, so they are the same for every scheduler.
"""

from __future__ import annotations

from smartsched.model.pod import PodClass, UsageKind, UsageProfile

_DEFAULTS: dict[PodClass, UsageProfile] = {
    # Online services run past their request at the evening peak (Burstable pods).
    PodClass.ONLINE: UsageProfile(UsageKind.DIURNAL, mean=0.6, amplitude=0.45, peak_hour=20.0),
    PodClass.BATCH: UsageProfile(UsageKind.CONSTANT, mean=0.8),
    PodClass.AI_TRAIN: UsageProfile(UsageKind.CONSTANT, mean=0.9),
    PodClass.AI_INFER: UsageProfile(
        UsageKind.BURSTY, mean=0.5, burst_factor=2.2, burst_probability=0.1
    ),
    PodClass.EDGE_RT: UsageProfile(UsageKind.BURSTY, mean=0.5, burst_factor=2.4,
                                   burst_probability=0.1),
}


def default_usage(cls: PodClass) -> UsageProfile:
    """The usage profile a pod of class ``cls`` gets when its source gives none."""
    return _DEFAULTS[cls]
