# Shared by the benches that count one process's instructions under callgrind
# (benches/php-callgrind.sh, benches/wsgi-callgrind.sh).

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
