"""Which MEC site holds which machines: the split of a fleet's series across sites.

Owns the experiment's data layout (in a deployment every site simply has its
own nodes' usage). A job's series stay together at one site, so a site's test
jobs are never seen by another site's training. Two layouts:

* ``level`` -- non-IID: jobs sorted by their mean CPU utilization and cut into
  contiguous groups of about equal series counts, one per site. Sites then
  differ in load level and in how their load moves (busy sites run different
  jobs from idle ones): the feature and label skew under which FedAvg is known
  to drift and FedProx is meant to help.
* ``iid`` -- jobs dealt to sites in a seeded random order.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np

from smartsched.forecast.data import Series, job_key
from smartsched.model.errors import ValidationError

PARTITIONS = ("level", "iid")


def partition_series(series: Sequence[Series], sites: Sequence[str], how: str = "level",
                     seed: int = 0) -> dict[str, list[str]]:
    """Site name -> the ids of the series it holds (every series at exactly one site)."""
    if how not in PARTITIONS:
        raise ValidationError("partition", f"must be one of {PARTITIONS}, got {how!r}")
    names = list(sites)
    if not names:
        raise ValidationError("sites", "no site given")
    if len(set(names)) != len(names):
        raise ValidationError("sites", f"names repeat: {names}")
    jobs: dict[str, list[Series]] = {}
    for s in series:
        jobs.setdefault(job_key(s.id), []).append(s)
    if len(jobs) < len(names):
        raise ValidationError("sites", f"{len(names)} sites but only {len(jobs)} jobs to share")
    keys = sorted(jobs)
    if how == "iid":
        order = [keys[i] for i in np.random.default_rng(seed).permutation(len(keys))]
        groups = [order[i::len(names)] for i in range(len(names))]
    else:
        level = {k: float(np.mean(np.concatenate([s.values[:, 0] for s in jobs[k]])))
                 for k in keys}
        order = sorted(keys, key=lambda k: (level[k], k))
        counts = np.cumsum([len(jobs[k]) for k in order])
        # Cut after the job where the running series count reaches each site's equal
        # share; every site keeps at least one job.
        share = counts[-1] * np.arange(1, len(names)) / len(names)
        cuts = (np.searchsorted(counts, share) + 1).tolist()
        for j in range(len(cuts)):
            low = cuts[j - 1] + 1 if j else 1
            cuts[j] = min(max(cuts[j], low), len(order) - (len(cuts) - j))
        bounds = [0, *map(int, cuts), len(order)]
        groups = [order[a:b] for a, b in itertools.pairwise(bounds)]
    return {site: [s.id for k in group for s in jobs[k]]
            for site, group in zip(names, groups, strict=True)}
