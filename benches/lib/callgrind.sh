# Shared by the benches that count one process's instructions under callgrind
# (benches/php-callgrind.sh, benches/php-corral-callgrind.sh, benches/wsgi-callgrind.sh).

# callgrind_calls FILE FUNCTION -> how many times the profiled process called FUNCTION.
# callgrind names a function once, `fn=(ID) NAME`, then refers to it by its ID alone; each
# call site is a `cfn=(ID)` line followed by `calls=COUNT ...`.
callgrind_calls() {
  awk -v fn="$2" '
    $0 ~ "^c?fn=\\([0-9]+\\) " fn "$" { match($0, /\([0-9]+\)/); id = substr($0, RSTART, RLENGTH) }
    /^cfn=/ { match($0, /\([0-9]+\)/); callee = substr($0, RSTART, RLENGTH); next }
    /^calls=/ { if (id != "" && callee == id) { split($0, f, /[= ]/); n += f[2] } callee = "" }
    END { print n + 0 }' "$1"
}

# one_php_pool_toml DIR PORT POOL_LINES -> DIR/corral.toml: one serving thread, an http
# listener on PORT, one PHP worker (POOL_LINES say which) serving DIR/www; run dir DIR/run.
one_php_pool_toml() {
  cat > "$1/corral.toml" <<TOML
[server]
runtime_dir = "$1/run"
log_level = "warn"
threads = 1
[[listen]]
address = "127.0.0.1:$2"
protocol = "http"
[pools.php]
$3
mode = "static"
max = 1
start_timeout = "60s"
[[contexts]]
pool = "php"
root = "$1/www"
TOML
}

# php_bench_binaries PAGE: CORRAL and WORKER made absolute (release builds by default, built
# when missing); PAGE must be hello or phpinfo.
php_bench_binaries() {
  CORRAL=${CORRAL:-target/release/corral}
  WORKER=${WORKER:-$(dirname "$CORRAL")/corral-php-worker}
  [ -x "$CORRAL" ] && [ -x "$WORKER" ] || cargo build --release --quiet -p corral -p corral-php-worker
  CORRAL=$(realpath "$CORRAL")
  WORKER=$(realpath "$WORKER")
  case $1 in hello | phpinfo) ;; *) echo "unknown page $1 (hello or phpinfo)" >&2; exit 2 ;; esac
}
