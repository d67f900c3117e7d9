#!/usr/bin/env bash
# At c=1, each row's req/s and idle entries per request with the guest's halt polling off
# (guest_halt_poll_ns=0) and on (200000, the kernel's default), in alternating order, on a
# stack that benches/wordpress-gateway.sh keeps up (benches/RESULTS.md section
# `halt-poll-c1`, decision 40): benches/c1-rounds.sh with HALT_POLL="0 200000".
#   bash benches/halt-poll.sh DIR [ROUNDS] [SECS]
HALT_POLL="0 200000" exec bash "$(dirname "${BASH_SOURCE[0]}")/c1-rounds.sh" "$@"
