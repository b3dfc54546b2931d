#!/bin/sh
# Written by shipyard's `invoke sandbox.runtimes`: this machine's root lacks CAP_SYS_RESOURCE in its capability bounding
# set. `apptainer build` runs %post and %test as nested `apptainer [-s|-d] --build-config exec|test ...` calls of
# this very path, and those ask for every capability whatever apptainer.conf says. This adds
# `--drop-caps CAP_SYS_RESOURCE` to exactly those calls; every other call reaches the real binary unchanged.
real="$(dirname "$0")/apptainer.real"
build=0
verb=0
for a in "$@"; do
    case "$a" in
        --build-config) build=1 ;;
        -*) ;;
        *) break ;;
    esac
    verb=$((verb + 1))
done
if [ "$build" = 1 ] && [ "$verb" -lt "$#" ]; then
    i=0
    total=$#
    while [ "$i" -lt "$total" ]; do
        a=$1
        shift
        set -- "$@" "$a"
        if [ "$i" -eq "$verb" ]; then
            case "$a" in
                exec | test) set -- "$@" --drop-caps 'CAP_SYS_RESOURCE' ;;
            esac
        fi
        i=$((i + 1))
    done
fi
exec "$real" "$@"
