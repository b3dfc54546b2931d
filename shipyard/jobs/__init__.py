"""Stage 5: jobs on the cluster -> what users read back: ``status`` (``invoke status``/``logs``), ``usage``
(``--monitor`` samples), ``nccl_report`` (nccl-tests output), ``doctor`` (preflight of a cluster)."""
