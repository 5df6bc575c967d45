#!/usr/bin/env bash
# HAProxy instructions per request for the data-plane configurations of `haproxy_scale`,
# counted by valgrind's callgrind: the same count for the same binary, configuration and
# requests whatever else the machine does, where requests per second vary by a third.
#
#   HSCALE_N= HSCALE_DP_ROUNDS=1 HSCALE_DP_SECS=1 HSCALE_KEEP=1 cargo bench --bench haproxy_scale
#   benches/haproxy_instructions.sh /tmp/<the work directory it printed> [seconds]
#
# Needs valgrind, wrk and haproxy. Starts the backend HAProxy of that directory (backend.cfg),
# then each of `c/haproxy.cfg` (the generated configuration, as `portcullis run` left it),
# `nolog/haproxy.cfg` (the same without request logging), `hand-logged.cfg` (the hand-written
# one with the same request log and X-Forwarded headers) and `hand.cfg` (the minimal
# hand-written one), with `nbthread 1` and standard output to /dev/null, under callgrind with
# instrumentation off; turns it on for `wrk -t1 -c8` (bench.local only, then rotating over the
# measured hosts with hosts.lua), and prints the instructions counted divided by the requests
# answered.
set -euo pipefail

work=${1:?usage: haproxy_instructions.sh WORK_DIR [SECONDS]}
secs=${2:-4}
out=$(mktemp -d)
trap 'kill $(cat "$out"/*.pid 2>/dev/null) 2>/dev/null || true; rm -rf "$out"' EXIT

haproxy -f "$work/backend.cfg" -D -p "$out/backend.pid"

measure() { # name config-directory config-file
    local name=$1 dir=$2 cfg=$3 copy="$2/.instructions-$1.cfg"
    sed '0,/^global/s//global\n  nbthread 1/' "$dir/$cfg" >"$copy"
    local port
    port=$(grep -m1 -oP 'bind 127\.0\.0\.1:\K[0-9]+' "$copy")
    for scenario in one rotating; do
        rm -f "$out"/cg.*
        (cd "$dir" && exec valgrind --tool=callgrind --instr-atstart=no \
            --callgrind-out-file="$out/cg.%p" haproxy -db -f "$copy" >/dev/null 2>&1) &
        local vg=$!
        for _ in $(seq 1 120); do
            curl -s -o /dev/null -H 'Host: bench.local' "http://127.0.0.1:$port/" && break
            sleep 0.5
        done
        callgrind_control -i on "$vg" >/dev/null 2>&1
        local result
        if [ "$scenario" = one ]; then
            result=$(wrk -t1 -c8 -d"${secs}s" --timeout 5s -H 'Host: bench.local' "http://127.0.0.1:$port/")
        else
            result=$(wrk -t1 -c8 -d"${secs}s" --timeout 5s -s "$work/hosts.lua" "http://127.0.0.1:$port/")
        fi
        callgrind_control -i off "$vg" >/dev/null 2>&1
        callgrind_control -d "$vg" >/dev/null 2>&1
        kill "$vg"
        wait "$vg" 2>/dev/null || true
        local requests non2xx total=0 file count
        requests=$(awk '/requests in/{print $1}' <<<"$result")
        non2xx=$(awk '/Non-2xx/{print $NF}' <<<"$result")
        for file in "$out"/cg.*; do
            count=$(callgrind_annotate "$file" 2>/dev/null \
                | awk '/^[0-9,]+ .*PROGRAM TOTALS/{gsub(",", "", $1); print $1}')
            total=$((total + ${count:-0}))
        done
        printf '%-36s %-9s %8d requests %6s non-2xx %8d instructions/request\n' \
            "$name" "$scenario" "$requests" "${non2xx:-0}" $((total / requests))
    done
    rm -f "$copy"
}

measure "Portcullis config" "$work/c" haproxy.cfg
measure "Portcullis config without request log" "$work/nolog" haproxy.cfg
measure "hand-written, log and headers" "$work" hand-logged.cfg
measure "hand-written" "$work" hand.cfg
