"""Federated learning across MEC edge sites: each site trains on its own data, only model
updates leave it (``site``), the cloud averages them (``aggregate``, ``rounds``)."""

# Bounds of a run's size (``rounds.federate`` checks them, the CLI's options too -- this
# module imports nothing, so the CLI reads them without loading the trainer): far beyond
# any useful run, low enough that a slip of the keyboard (--rounds 1000000000) is refused
# rather than run for weeks.
MAX_ROUNDS = 10_000
MAX_LOCAL_EPOCHS = 1_000
