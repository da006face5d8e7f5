"""Federated learning across MEC edge sites: each site trains on its own data, only model
updates leave it (``site``), the cloud averages them (``aggregate``, ``rounds``)."""
