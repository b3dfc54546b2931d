"""Submitting from a workstation over ssh (docs/remote.md): one shared, already-authenticated OpenSSH connection
(ControlMaster) to a cluster's login node, the Slurm clients and forwarded commands run through it
(:mod:`shipyard.remote.transport`), and the project shipped to the cluster's storage (:mod:`shipyard.remote.sync`).

Why the system ssh client and not a Python ssh library: clusters with two-factor login ask for a new one-time code
on every new connection; only OpenSSH's master connection lets many processes share one login.
"""
