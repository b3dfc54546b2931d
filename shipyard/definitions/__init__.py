"""Stage 2: the model -> ``definitions/<env>.def`` (Apptainer), ``.Dockerfile`` and ``.test.sh``, and the
environment's hash lock.

``recipe`` (backend-neutral steps, hpccm-style primitives), ``render`` (the templates; ``invoke render`` and
``invoke lock``), ``pylock`` (the Python dependency lock: ``uv pip compile`` with hashes; "lock" alone would be
confused with the build's flock).
"""
