"""Stage 4: images -> ``launch/<name>.sbatch`` and the other ways users reach an image on a cluster.

``launcher`` (the Launcher model, rendering and submission; ``invoke launch`` and ``invoke nccl-test``), ``fabric``
(NCCL settings per fabric), ``shell`` (``invoke shell``), ``modules`` (Lmod modulefiles and wrappers).
"""
