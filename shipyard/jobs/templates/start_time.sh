# shipyard doctor --time-start: runs under salloc (one node) on the login node; times three steps on that node.
# Output: "@start-time KEY VALUE" lines (node, t0..t3: clock readings in seconds); a failed step ends it non-zero
# with srun's own error on stderr.
# The command in the container is `/bin/sh -c "exit 0"`: a lone ":" would be srun's heterogeneous-job separator.
# Arguments: NAME [MODULE...] -- START_WORD...  (NAME: the pyxis container to remove afterwards, "" for none)
name=$1
shift
mods=()
while [ "$#" -gt 0 ] && [ "$1" != "--" ]; do mods+=("$1"); shift; done
shift
export USER="${USER:-$(id -un)}"  # ch-run refuses to start without $USER
if [ "${#mods[@]}" -gt 0 ]; then
    if ! command -v module >/dev/null 2>&1; then
        for init in /etc/profile.d/lmod.sh /usr/share/lmod/lmod/init/bash; do
            # shellcheck disable=SC1090
            if [ -r "$init" ]; then . "$init"; break; fi
        done
    fi
    for m in "${mods[@]}"; do module load "$m" > /dev/null || exit 3; done
fi
step() { srun --nodes=1 --ntasks=1 "$@" > /dev/null; }
now() { date +%s.%N; }
printf '@start-time node %s\n' "$(srun --nodes=1 --ntasks=1 hostname)"
t0=$(now)
step true || exit 4
t1=$(now)
step "$@" /bin/sh -c "exit 0" || exit 5
t2=$(now)
step "$@" /bin/sh -c "exit 0" || exit 6
t3=$(now)
if [ -n "$name" ]; then  # a named container of container_scope=global outlives the job: nothing of ours stays
    srun --nodes=1 --ntasks=1 enroot remove --force "pyxis_$name" > /dev/null 2>&1 || true
fi
printf '@start-time t0 %s\n@start-time t1 %s\n@start-time t2 %s\n@start-time t3 %s\n' "$t0" "$t1" "$t2" "$t3"
