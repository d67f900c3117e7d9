#!/usr/bin/env bash
# Question: does a huge body pass through corral at constant memory (ARCHITECTURE.md invariant 4)?
# Sends a SIZE_MIB upload (php-cgi reads php://input and answers its md5) and a SIZE_MIB
# download (php-cgi writes it in 64 KiB pieces) through corral's http listener, checks both
# md5s, and prints corral's peak RSS (VmHWM) after each. Loopback only; every process it
# starts it stops. Needs php-cgi and curl (scripts/setup-peers.sh).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
SIZE_MIB=${SIZE_MIB:-1024}
CORRAL=${CORRAL:-target/release/corral}
[ -x "$CORRAL" ] || cargo build --release --quiet
scratch=$(mktemp -d /tmp/corral-big.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$scratch"
}
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
mkdir -p "$scratch/www"
cat > "$scratch/www/up.php" <<'PHP'
<?php
$in = fopen('php://input', 'rb'); $h = hash_init('md5'); $n = 0;
while (!feof($in)) { $c = fread($in, 65536); $n += strlen($c); hash_update($h, $c); }
echo hash_final($h), " ", $n, "\n";
PHP
cat > "$scratch/www/down.php" <<'PHP'
<?php
$mib = (int)$_GET['mib']; $chunk = str_repeat('0123456789abcdef', 4096);
header('Content-Length: ' . ($mib * 1048576));
for ($i = 0; $i < $mib * 16; $i++) { echo $chunk; flush(); }
PHP
env -i PATH=/usr/bin:/bin PHP_FCGI_CHILDREN=0 PHP_FCGI_MAX_REQUESTS=0 php-cgi \
  -d enable_post_data_reading=0 -d post_max_size=0 -d output_buffering=0 -d memory_limit=64M \
  -b "$scratch/php.sock" & pids+=($!)
port=$(free_port)
cat > "$scratch/corral.toml" <<CONF
[server]
log_level = "warn"
[[listen]]
address = "127.0.0.1:$port"
protocol = "http"
[pools.php]
servers = ["unix:$scratch/php.sock"]
request_timeout = "1h"
first_byte_timeout = "1h"
[[contexts]]
pool = "php"
root = "$scratch/www"
CONF
for _ in $(seq 100); do [ -S "$scratch/php.sock" ] && break; sleep 0.05; done
"$CORRAL" run -c "$scratch/corral.toml" >/dev/null & corral=$!; pids+=($corral)
sleep 0.5
hwm() { awk '/VmHWM/ {print $2 / 1024 " MiB"}' "/proc/$corral/status"; }
echo "corral after start: peak RSS $(hwm)"
head -c $((SIZE_MIB * 1048576)) /dev/urandom > "$scratch/body"
want=$(md5sum "$scratch/body" | cut -d' ' -f1)
start=$(date +%s.%N)
got=$(curl -sS -X POST -T "$scratch/body" -H 'Content-Type: application/octet-stream' -H 'Expect:' "http://127.0.0.1:$port/up.php")
end=$(date +%s.%N)
rm "$scratch/body"
[ "${got%% *}" = "$want" ] || { echo "upload md5 mismatch: $got vs $want" >&2; exit 1; }
echo "upload ${SIZE_MIB} MiB: md5 ok, $(awk -v s="$start" -v e="$end" 'BEGIN {printf "%.1f", e-s}') s; corral peak RSS $(hwm)"
start=$(date +%s.%N)
got=$(curl -sS "http://127.0.0.1:$port/down.php?mib=$SIZE_MIB" | md5sum | cut -d' ' -f1)
end=$(date +%s.%N)
want=$(python3 -c "import hashlib,sys; h=hashlib.md5(); c=b'0123456789abcdef'*4096; [h.update(c) for _ in range($SIZE_MIB*16)]; print(h.hexdigest())")
[ "$got" = "$want" ] || { echo "download md5 mismatch" >&2; exit 1; }
echo "download ${SIZE_MIB} MiB: md5 ok, $(awk -v s="$start" -v e="$end" 'BEGIN {printf "%.1f", e-s}') s; corral peak RSS $(hwm)"
