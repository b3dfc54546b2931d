"""Stage 3: definitions -> images in ``containers/`` (.sif/.sqsh + a JSON manifest), signed, pushed and pulled.

``common`` (what every backend shares: artifact records, flock, recovery, child processes, tool versions),
``apptainer`` and ``docker`` (the backends), ``engine`` (``invoke build``: cache, lock, temp-then-rename, manifest),
``on_slurm`` (the same build as a batch job on a build partition), ``log``, ``manifest`` (the typed manifest), ``sign``,
``push``. Putting images into a cluster's storage is :mod:`shipyard.staging`, one floor up: nothing here imports it.
"""
