#!/usr/bin/env bash
# Builds PHP 8.2's LiteSpeed SAPI (lsphp) from Debian's own php8.2 source
# package and installs the stripped binary at $CORRAL_CACHE_DIR/lsphp-8.2/lsphp
# (default /var/cache/corral/lsphp-8.2/lsphp), with OPcache built from the same
# tree as opcache.so beside it (a zend_extension) and opcache.ini, a php.ini
# that loads and enables it: `lsphp -c <dir>/opcache.ini`. (lsphp takes no -d
# options in LSAPI mode: only -b, -c and -s.) Debian ships no lsphp, the LSAPI
# tests need a real one, and a benchmark against php-fpm (which has Debian's
# OPcache) is only fair with OPcache on both sides. Idempotent: does nothing
# when a working binary and a loadable opcache.so are already there (opcache.ini
# is rewritten); a cached binary without opcache.so is rebuilt. Needs root
# (apt-get), gcc, make, dpkg-dev, xz-utils.
set -euo pipefail

CACHE_DIR="${CORRAL_CACHE_DIR:-/var/cache/corral}"
DEST_DIR="$CACHE_DIR/lsphp-8.2"
DEST="$DEST_DIR/lsphp"
OPCACHE="$DEST_DIR/opcache.so"
OPCACHE_INI="$DEST_DIR/opcache.ini"
BUILD_ROOT="$CACHE_DIR/build"

# Source versions to try, newest first. The newest security release's source
# may 404 on the mirror reachable from CI, so point releases follow.
VERSIONS=(8.2.36-1~deb12u1 8.2.32-1~deb12u1 8.2.29-1~deb12u1 8.2.28-1~deb12u1)

# Cheap extensions that build from the PHP tree alone (no -dev packages).
# OPcache always builds shared (modules/opcache.so), never into the binary.
EXTENSIONS=(--enable-ctype --enable-posix --enable-session --enable-filter
    --enable-tokenizer --enable-opcache)

log() { printf '[build-lsphp] %s\n' "$*"; }

works() {
    [ -x "$DEST" ] && "$DEST" -v 2>/dev/null | grep -qi litespeed
}

write_ini() {
    printf '%s\n' \
        "; Loads the OPcache built with $DEST (scripts/build-lsphp.sh): lsphp -c $OPCACHE_INI" \
        "zend_extension=$OPCACHE" "opcache.enable=1" >"$OPCACHE_INI.tmp.$$"
    chmod 0644 "$OPCACHE_INI.tmp.$$"
    mv -f "$OPCACHE_INI.tmp.$$" "$OPCACHE_INI"
}

# opcache.so is there and this binary loads it (same API build) through
# opcache.ini. -v prints "with Zend OPcache" only when the zend_extension loaded.
opcache_works() {
    [ -f "$OPCACHE" ] && [ -f "$OPCACHE_INI" ] &&
        "$DEST" -c "$OPCACHE_INI" -v 2>/dev/null | grep -q 'with Zend OPcache'
}

if works && [ -f "$OPCACHE" ]; then
    write_ini
    if opcache_works; then
        log "present: $DEST ($("$DEST" -v | head -n1)) with $OPCACHE ($OPCACHE_INI)"
        exit 0
    fi
fi
if works; then
    log "$DEST has no loadable $OPCACHE; rebuilding"
fi

start=$SECONDS
export DEBIAN_FRONTEND=noninteractive

# 1. A deb-src entry mirroring the deb stanzas of debian.sources.
src_list=/etc/apt/sources.list.d/corral-deb-src.sources
have_src() {
    grep -rqsE '^(Types:.*deb-src|deb-src )' /etc/apt/sources.list /etc/apt/sources.list.d/
}
if ! have_src; then
    if [ ! -f /etc/apt/sources.list.d/debian.sources ]; then
        log "no /etc/apt/sources.list.d/debian.sources and no deb-src entry" >&2
        exit 1
    fi
    sed 's/^Types:.*/Types: deb-src/' /etc/apt/sources.list.d/debian.sources >"$src_list.tmp"
    mv "$src_list.tmp" "$src_list"
    log "added $src_list"
fi
apt-get update -qq

# 2. Fetch the source, trying each version.
mkdir -p "$BUILD_ROOT"
scratch="$(mktemp -d "$BUILD_ROOT/php.XXXXXX")"
cleanup() { rm -rf "$scratch"; rmdir "$BUILD_ROOT" 2>/dev/null || true; }
trap cleanup EXIT
cd "$scratch"
got=""
for v in "${VERSIONS[@]}"; do
    log "trying apt-get source php8.2=$v"
    if apt-get source -qq "php8.2=$v" >fetch.log 2>&1; then
        got="$v"
        break
    fi
    tail -n 3 fetch.log >&2 || true
    find . -mindepth 1 -maxdepth 1 ! -name fetch.log -exec rm -rf {} +
done
if [ -z "$got" ]; then
    log "could not fetch any php8.2 source (tried ${VERSIONS[*]})" >&2
    exit 1
fi
log "fetched php8.2 $got in $((SECONDS - start)) s"

srcdir="$(find . -mindepth 1 -maxdepth 1 -type d -name 'php8.2-*' | head -n1)"
cd "$srcdir"

# 3. Configure and build only the litespeed SAPI (and opcache.so).
t=$SECONDS
./configure --prefix="$scratch/inst" --disable-all --disable-cgi --disable-cli \
    --disable-phpdbg --enable-litespeed --without-pear --disable-debug \
    "${EXTENSIONS[@]}" >"$scratch/configure.log" 2>&1 ||
    { tail -n 30 "$scratch/configure.log" >&2; exit 1; }
log "configure: $((SECONDS - t)) s"
t=$SECONDS
make -j"$(nproc)" >"$scratch/make.log" 2>&1 ||
    { tail -n 40 "$scratch/make.log" >&2; exit 1; }
log "make: $((SECONDS - t)) s"

# 4. Install atomically, opcache.so first: a binary is only ever beside an
# opcache.so of its own build once both moves are done, and the check above
# rebuilds when either is missing or they do not match.
bin=sapi/litespeed/php
so=modules/opcache.so
if [ ! -f "$so" ]; then
    log "no $so after make" >&2
    exit 1
fi
strip "$bin"
strip --strip-unneeded "$so"
mkdir -p "$DEST_DIR"
cp "$so" "$OPCACHE.tmp.$$"
chmod 0644 "$OPCACHE.tmp.$$"
mv -f "$OPCACHE.tmp.$$" "$OPCACHE"
cp "$bin" "$DEST.tmp.$$"
chmod 0755 "$DEST.tmp.$$"
mv -f "$DEST.tmp.$$" "$DEST"
write_ini
cd /
if ! works; then
    log "built binary does not report litespeed" >&2
    exit 1
fi
if ! opcache_works; then
    log "built binary does not load $OPCACHE" >&2
    exit 1
fi
log "installed $DEST: $("$DEST" -v | head -n1)"
log "installed $OPCACHE and $OPCACHE_INI"
printf '<?php echo implode(" ", get_loaded_extensions());' >"$scratch/ext.php"
log "extensions: $("$DEST" -q "$scratch/ext.php")"
log "with -c $OPCACHE_INI: $("$DEST" -q -c "$OPCACHE_INI" "$scratch/ext.php")"
log "total: $((SECONDS - start)) s"
