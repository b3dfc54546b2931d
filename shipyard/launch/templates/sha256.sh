# shipyard_sha256 FILE: the file's sha256 as 64 hex digits, empty when it cannot be read. openssl and Python's hashlib
# use the CPU's SHA instructions where it has them; coreutils' sha256sum before 9.0 does not (3x slower on an image
# here, bench/image_check.py), so it comes last. Each is tried in turn until one gives 64 hex digits.
shipyard_hex64() {
  case $1 in *[!0-9a-f]* | "") return 1 ;; esac
  [ "$(printf %s "$1" | wc -c)" -eq 64 ]
}
shipyard_sha256() {
  shipyard_h=
  if command -v openssl >/dev/null 2>&1; then
    shipyard_h=$(openssl dgst -sha256 -r < "$1" 2>/dev/null | cut -d' ' -f1)
  fi
  if ! shipyard_hex64 "$shipyard_h" && command -v python3 >/dev/null 2>&1; then
    shipyard_h=$(python3 -c 'import hashlib, sys
h = hashlib.sha256()
with open(sys.argv[1], "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
        h.update(block)
print(h.hexdigest())' "$1" 2>/dev/null)
  fi
  if ! shipyard_hex64 "$shipyard_h"; then
    shipyard_h=$(sha256sum < "$1" 2>/dev/null | cut -d' ' -f1)
  fi
  printf '%s' "$shipyard_h"
}
