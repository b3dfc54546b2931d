"""Stage 4: an image from ``containers/`` (or a registry, or the docker build) into a cluster's storage, and the
record beside it that launchers bind to.

``stage`` (`invoke stage`: checks, atomic copy, verification, permissions) and ``record`` (the
:class:`~shipyard.staging.record.StageRecord`, its one reader and writer, and the launcher's binding). Its own floor,
between ``launch`` above and ``containers`` below: staging reads the build manifest, launch reads the record, and
``containers`` knows neither.
"""
