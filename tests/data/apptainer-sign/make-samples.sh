#!/bin/bash
# Makes the samples of tests/data/apptainer-sign/ with the real Apptainer 1.4.5: bash make-samples.sh OUTDIR
set -u
W=/tmp/apptainer-sign-samples; OUT=$1
rm -rf $W; mkdir -p $W/keys $W/config $W/rootfs/bin $W/rootfs/etc; chmod 700 $W/keys
export APPTAINER_KEYSDIR=$W/keys APPTAINER_CONFIGDIR=$W/config PATH=/opt/shipyard/apptainer-1.4.5/bin:$PATH
cd "$W" || exit 1
run() { # name, then the command: stdout, stderr and exit status kept apart
  local name=$1; shift
  "$@" >"$OUT/$name.stdout" 2>"$OUT/$name.stderr" </dev/null; echo $? >"$OUT/$name.exit"
}
apptainer --version > "$OUT/version.txt"
apptainer key newpair --name "Course Staff" --email staff@example.org --comment gpu-course --password "" --push=false </dev/null
apptainer key newpair --name "Teaching Assistant" --email ta@example.org --comment "second signer" --password "" --push=false </dev/null
run key-list-secret apptainer key list --secret
cp /bin/busybox rootfs/bin/busybox; ln -s busybox rootfs/bin/sh; echo payload > rootfs/etc/payload
apptainer build image.sif rootfs/ </dev/null
cp image.sif unsigned.sif
run verify-unsigned apptainer verify --local unsigned.sif
run json-verify-unsigned apptainer verify --local --json unsigned.sif
cp image.sif one.sif; apptainer sign --keyidx 0 one.sif </dev/null
run verify-one-signer apptainer verify --local one.sif
run json-verify-one-signer apptainer verify --local --json one.sif
cp one.sif two.sif; apptainer sign --keyidx 1 two.sif </dev/null
run verify-two-signers apptainer verify --local two.sif
run json-verify-two-signers apptainer verify --local --json two.sif
cp one.sif tampered.sif
# one byte in the middle of the squashfs data object (its start-end from `siftool list`) inverted
python3 - <<'PY'
import re, subprocess
listing = subprocess.run(["siftool", "list", "tampered.sif"], capture_output=True, text=True, check=True).stdout
start, end = map(int, re.search(r"\|(\d+)-(\d+)\s*\|FS ", listing).groups())
with open("tampered.sif", "r+b") as fh:
    fh.seek((start + end) // 2)
    b = fh.read(1); fh.seek(-1, 1); fh.write(bytes([b[0] ^ 0xFF]))
PY
run verify-tampered apptainer verify --local tampered.sif
run json-verify-tampered apptainer verify --local --json tampered.sif
FP1=$(sed -n 's/^ *Fingerprint: *//p' "$OUT/key-list-secret.stdout" | sed -n 2p)
apptainer key remove "$FP1" </dev/null
run key-list-public-after-remove apptainer key list
run verify-unknown-signer apptainer verify --local two.sif
run json-verify-unknown-signer apptainer verify --local --json two.sif
run siftool-list-two-signers siftool list two.sif
