# shipyard doctor probe: runs on the login node and, through srun, on one compute node.
# It only looks; the one thing it writes is a temporary file in the storage directory, removed at once.
# Output: one line per fact, "@doctor<TAB>KEY<TAB>VALUE"; everything else on stdout/stderr is ignored.
# Arguments: STORAGE MARKER [MODULE...]  (MARKER: a file the login node left in STORAGE, "-" for none)
storage=$1
marker=$2
shift 2

say() { printf '@doctor\t%s\t%s\n' "$1" "$2"; }
first_line() { head -n 1 | tr -d '\r'; }

say hostname "$(hostname)"
say user "$(id -un)"

if [ "$#" -gt 0 ]; then
    # A non-login shell has no `module` function: load Lmod's bash init (without a login shell resetting PATH).
    if ! command -v module >/dev/null 2>&1; then
        for init in /etc/profile.d/lmod.sh /usr/share/lmod/lmod/init/bash; do
            # shellcheck disable=SC1090
            if [ -r "$init" ]; then . "$init"; break; fi
        done
    fi
    if command -v module >/dev/null 2>&1; then
        for m in "$@"; do
            if module load "$m" >/dev/null 2>&1; then say module_loaded "$m"; else say module_failed "$m"; fi
        done
    else
        say module_failed "no module command"
    fi
fi

if command -v srun >/dev/null 2>&1; then
    v=$(srun --version 2>&1)
    say slurm "$(printf '%s\n' "$v" | grep -m 1 '^slurm' || printf '%s\n' "$v" | first_line)"
    if srun --help 2>&1 | grep -q -- '--container-image'; then say pyxis yes; else say pyxis no; fi
else
    say slurm missing
fi

if command -v apptainer >/dev/null 2>&1; then
    say apptainer "$(apptainer --version 2>&1 | first_line)"
elif command -v singularity >/dev/null 2>&1; then
    say apptainer "$(singularity --version 2>&1 | first_line)"
else
    say apptainer missing
fi

if command -v enroot >/dev/null 2>&1; then
    say enroot "$(enroot version 2>&1 | first_line)"
else
    say enroot missing
fi

if command -v ch-run >/dev/null 2>&1; then
    # ch-run checks $USER before anything else, --version included ("$USER not set")
    say ch-run "$(USER=${USER:-$(id -un)} ch-run --version 2>&1 | first_line)"
else
    say ch-run missing
fi

# How containers start here (the site's runtime mode), read from the configuration each runtime reads itself:
# pyxis's arguments on its plugstack line, enroot's system config, Apptainer's setuid and SquashFS mount settings.
# PlugStackConfig unset shows as "(null)": Slurm then reads plugstack.conf beside slurm.conf (its SLURM_CONF line).
config=$(scontrol show config 2>/dev/null)
plugstack=$(printf '%s\n' "$config" | sed -n 's/^PlugStackConfig *= *//p' | head -n 1)
case $plugstack in
    "" | "(null)")
        conf=$(printf '%s\n' "$config" | sed -n 's/^SLURM_CONF *= *//p' | head -n 1)
        plugstack="$(dirname "${conf:-${SLURM_CONF:-/etc/slurm/slurm.conf}}")/plugstack.conf" ;;
esac
for f in "$plugstack" "$(dirname "$plugstack")"/plugstack.conf.d/*; do
    [ -f "$f" ] || continue
    grep -v '^[[:space:]]*#' "$f" 2>/dev/null | grep 'spank_pyxis\|pyxis\.so' | head -n 4 | while read -r _ plugin rest; do
        say pyxis_plugin "$plugin"
        for w in $rest; do say pyxis_arg "$w"; done
    done
done
if [ -r /etc/enroot/enroot.conf ]; then
    grep -E '^[[:space:]]*ENROOT_[A-Z_]+[[:space:]]' /etc/enroot/enroot.conf | head -n 40 | while read -r k v; do
        say enroot_conf "$k $v"
    done
fi
if command -v apptainer >/dev/null 2>&1; then
    etc=$(apptainer buildcfg 2>/dev/null | sed -n 's/^SYSCONFDIR=//p' | head -n 1)
    libexec=$(apptainer buildcfg 2>/dev/null | sed -n 's/^LIBEXECDIR=//p' | head -n 1)
    if [ -n "$etc" ] && [ -r "$etc/apptainer/apptainer.conf" ]; then
        grep -E '^[[:space:]]*allow setuid(-mount [a-z]+)?[[:space:]]*=' "$etc/apptainer/apptainer.conf" | while IFS= read -r l; do
            say apptainer_conf "$(printf '%s' "$l" | tr -s ' \t' ' ' | sed 's/^ //')"
        done
    fi
    if [ -n "$libexec" ] && [ -u "$libexec/apptainer/bin/starter-suid" ]; then say apptainer_suid yes; else say apptainer_suid no; fi
fi
for t in squashfuse_ll squashfuse; do
    if command -v "$t" >/dev/null 2>&1; then say squashfuse "$(command -v "$t")"; fi
done

if command -v fakeroot >/dev/null 2>&1; then say fakeroot "$(command -v fakeroot)"; else say fakeroot missing; fi
if grep -q "^$(id -un):" /etc/subuid 2>/dev/null; then say subuid yes; else say subuid no; fi

if command -v nvidia-smi >/dev/null 2>&1; then
    if out=$(nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv,noheader 2>&1); then
        while IFS= read -r line; do
            [ -n "$line" ] && say gpu "$line"
        done <<< "$out"
    else
        say gpu_error "$(printf '%s\n' "$out" | first_line)"
    fi
else
    say gpu missing
fi

if [ -z "$storage" ]; then
    say storage unset
elif [ ! -d "$storage" ]; then
    say storage missing
else
    say storage present
    if tmp=$(mktemp "$storage/.shipyard-doctor.XXXXXX" 2>/dev/null); then
        rm -f "$tmp"
        say storage_writable yes
    else
        say storage_writable no
    fi
    if [ "$marker" != "-" ]; then
        if [ -e "$storage/$marker" ]; then say storage_shared yes; else say storage_shared no; fi
    fi
    say storage_free_kb "$(df -Pk "$storage" 2>/dev/null | awk 'NR == 2 { print $4 }')"
fi
