#!/usr/bin/env bash
# Builds corral_VERSION_ARCH.deb (VERSION from Cargo.toml) with dpkg-deb alone: the binary as
# /usr/bin/corral, the native PHP worker (workers/php) beside it as /usr/bin/corral-php-worker
# (where corral looks for it; it needs libphp8.2-embed, which the package recommends),
# packaging/corral.toml as the conffile /etc/corral/corral.toml, conf/ as
# examples under /usr/share/doc/corral/examples, conf/systemd's service and socket units
# (ExecStart pointed at /usr/bin/corral) in /lib/systemd/system, and the maintainer scripts
# of packaging/debian (a `corral` system user; nothing enabled or started; purge removes the
# user and its state).
#
#   bash scripts/build-deb.sh                       # cargo build --release, then package it
#   bash scripts/build-deb.sh --pgo                 # corral built by scripts/build-pgo.sh
#   bash scripts/build-deb.sh --binary PATH [--worker PATH] --out DIR [--fast]
#
# --binary packages that binary instead of building one (tests/package_deb.rs passes the
# debug binary it was built with); --worker names the corral-php-worker to ship (default: the
# one beside the binary); --pgo builds corral with profile-guided optimisation
# (scripts/build-pgo.sh, which needs llvm-profdata) and the worker with cargo build --release;
# --out is where the .deb goes (default target/debian);
# --fast compresses with gzip -1 instead of xz. The path of the .deb is the last line of output.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
binary=""
worker=""
out="$repo/target/debian"
compress=(-Zxz)
pgo=""

usage() {
    sed -n '2,/^set /p' "$0" | grep '^#' | sed 's/^# \{0,1\}//'
}

while [ $# -gt 0 ]; do
    case "$1" in
    --binary) binary=${2:?--binary needs a path}; shift 2 ;;
    --worker) worker=${2:?--worker needs a path}; shift 2 ;;
    --out) out=${2:?--out needs a directory}; shift 2 ;;
    --fast) compress=(-Zgzip -z1); shift ;;
    --pgo) pgo=1; shift ;;
    -h | --help) usage; exit 0 ;;
    *) echo "build-deb.sh: unknown argument '$1' (see --help)" >&2; exit 64 ;;
    esac
done

# The [package] table's version, not a dependency's.
version=$(awk '/^\[package\]/ { p = 1; next } /^\[/ { p = 0 } p && /^version *=/ { gsub(/[" ]/, "", $0); sub(/^version=/, "", $0); print; exit }' "$repo/Cargo.toml")
if ! [[ "$version" =~ ^[0-9][0-9A-Za-z.+~-]*$ ]]; then
    echo "build-deb.sh: no usable version in Cargo.toml's [package] ('$version')" >&2
    exit 65
fi
arch=$(dpkg --print-architecture)

if [ -z "$binary" ] && [ -n "$pgo" ]; then
    binary=$(bash "$repo/scripts/build-pgo.sh" | tail -n 1)
    (cd "$repo" && cargo build --release -p corral-php-worker)
    worker=${worker:-$repo/target/release/corral-php-worker}
elif [ -z "$binary" ]; then
    (cd "$repo" && cargo build --release --bin corral && cargo build --release -p corral-php-worker)
    binary="$repo/target/release/corral"
fi
if [ ! -x "$binary" ]; then
    echo "build-deb.sh: $binary is not an executable" >&2
    exit 66
fi
worker=${worker:-$(dirname "$binary")/corral-php-worker}
if [ ! -x "$worker" ]; then
    echo "build-deb.sh: $worker is not an executable (build it with" \
        "cargo build -p corral-php-worker, or name it with --worker)" >&2
    exit 66
fi

stage=$(mktemp -d "${TMPDIR:-/tmp}/corral-deb.XXXXXX")
trap 'rm -rf "$stage"' EXIT
chmod 0755 "$stage"

install -D -m 0755 "$binary" "$stage/usr/bin/corral"
install -m 0755 "$worker" "$stage/usr/bin/corral-php-worker"
install -D -m 0644 "$repo/packaging/corral.toml" "$stage/etc/corral/corral.toml"
install -d -m 0755 "$stage/lib/systemd/system"
sed 's#/usr/local/bin/corral#/usr/bin/corral#g' "$repo/conf/systemd/corral.service" \
    >"$stage/lib/systemd/system/corral.service"
install -m 0644 "$repo/conf/systemd/corral.socket" "$stage/lib/systemd/system/corral.socket"
chmod 0644 "$stage/lib/systemd/system/corral.service"
if grep -q /usr/local/bin "$stage/lib/systemd/system/corral.service"; then
    echo "build-deb.sh: corral.service still names /usr/local/bin" >&2
    exit 70
fi

doc="$stage/usr/share/doc/corral"
install -d -m 0755 "$doc/examples"
cp -R "$repo/conf/." "$doc/examples/"
install -m 0644 "$repo/README.md" "$doc/README.md"
install -m 0644 "$repo/packaging/debian/copyright" "$doc/copyright"
find "$doc" -type d -exec chmod 0755 {} +
find "$doc" -type f -exec chmod 0644 {} +

install -d -m 0755 "$stage/DEBIAN"
size=$(du -sk --exclude=DEBIAN "$stage" | cut -f1)
# The worker is linked against libphp8.2 (PHP's embed SAPI): recommended beside php-cgi, not
# required, since only `worker = "native"` pools run it (`corral check` names what is missing).
sed -e "s/@VERSION@/$version/" -e "s/@ARCH@/$arch/" -e "s/@SIZE@/$size/" \
    -e "s/^Recommends: php-cgi$/Recommends: php-cgi, libphp8.2-embed/" \
    "$repo/packaging/debian/control.in" >"$stage/DEBIAN/control"
grep -q '^Recommends: .*libphp8.2-embed' "$stage/DEBIAN/control" || {
    echo "build-deb.sh: packaging/debian/control.in has no 'Recommends: php-cgi' line to extend" >&2
    exit 70
}
echo /etc/corral/corral.toml >"$stage/DEBIAN/conffiles"
# What `dpkg --verify` and debsums check the installed files against (conffiles have their
# own sums in dpkg's database).
(cd "$stage" && find . -type f ! -path './DEBIAN/*' ! -path './etc/*' -printf '%P\0' |
    LC_ALL=C sort -z | xargs -0 md5sum) >"$stage/DEBIAN/md5sums"
chmod 0644 "$stage/DEBIAN/md5sums"
for script in postinst prerm postrm; do
    install -m 0755 "$repo/packaging/debian/$script" "$stage/DEBIAN/$script"
done

mkdir -p "$out"
deb="$out/corral_${version}_${arch}.deb"
dpkg-deb --root-owner-group "${compress[@]}" --build "$stage" "$deb" >&2
echo "$deb"
