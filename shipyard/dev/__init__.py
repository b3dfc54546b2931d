"""Development only: what ``invoke test``, the tests and bench/ use (Debian test packages, dockerd and an OCI
registry on loopback). Nothing in the stages imports it."""
