"""Stage 1: registry.yaml -> the one model every later stage reads.

``model`` (frozen dataclasses), ``loader`` (YAML with line marks, JSON Schema, ``extends``), ``compat`` (the
compatibility facts and checks), ``report`` (list/show/check tables). The loading entry points are re-exported here
for the commands layer (:class:`shipyard.commands.context.Context` loads the registry once per command); stages
take the loaded :class:`~shipyard.registry.model.Registry` and never call ``load`` themselves.
"""

from shipyard.registry.loader import REGISTRY_ENV, load, load_text, registry_path

__all__ = ["REGISTRY_ENV", "load", "load_text", "registry_path"]
