"""Where an image that shipyard builds keeps its parts: read by the recipe that builds it and by whatever looks inside
a built image (shipyard/containers/contents.py), which must not need the recipe to know them."""

VENV = "/opt/venv"  # the image's Python environment: every pinned package, torch included
SHIPYARD_DIR = "/opt/shipyard"  # shipyard's own files in the image: its test script, the environment's lock
