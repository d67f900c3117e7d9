#!/usr/bin/env bash
# Installs the real peers corral's tests talk to (ARCHITECTURE.md, "Tests, scripts and CI"):
# Debian's php-cgi, php-fpm, nginx, Apache, lighttpd, Caddy, Ruby with
# ruby-fcgi and ruby-rack, wrk, ab and curl, WordPress and MariaDB; Passenger, uWSGI,
# gunicorn, Puma and HAProxy for the benchmarks; the PyPI packages scgi and flup,
# and Granian for the benchmarks in a venv of its own;
# and lsphp, built once from Debian's php8.2 source by scripts/build-lsphp.sh.
# Idempotent and quick when everything is present (no apt-get update then).
# Needs root. Starts no daemon: package installs run under a policy-rc.d that
# forbids starting.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
export DEBIAN_FRONTEND=noninteractive
start=$SECONDS

log() { printf '[setup-peers] %s\n' "$*"; }

APT_PACKAGES=(php8.2-cgi php8.2-fpm nginx ruby ruby-fcgi ruby-rack wrk apache2-utils
    curl ca-certificates)
APT_PACKAGES+=(apache2 lighttpd caddy)  # front-server matrix tests (tests/front_*.rs)
APT_PACKAGES+=(chromium tmux)  # status UI tests (tests/status_ui.rs)
APT_PACKAGES+=(passenger uwsgi uwsgi-plugin-python3 gunicorn puma)  # launcher peers (benches/launchers.sh)
APT_PACKAGES+=(haproxy)  # the FastCGI gateway peer of benches/hop.sh
APT_PACKAGES+=(systemd)  # systemd-analyze verify of the packaged units (tests/package_deb.rs)
APT_PACKAGES+=(ruby-rails python3-django python3-flask python3-venv ruby-bundler)  # application tests (tests/app_*.rs); their venv's PyPI package is installed by the test itself
APT_PACKAGES+=(wordpress wordpress-theme-twentytwentyone mariadb-server)  # tests/app_wordpress.rs (it runs its own mariadbd; the theme is only a Recommends)
APT_PACKAGES+=(python3-yaml)  # tests/kubernetes_example.rs parses conf/kubernetes/ with it
APT_PACKAGES+=(libphp8.2-embed php8.2-dev)  # the native PHP worker (workers/php) links libphp; tests/php_native.rs
APT_PACKAGES+=(python3-dev)  # the native WSGI worker (workers/wsgi) embeds libpython3.11; tests/wsgi_native.rs
# Used by scripts/build-lsphp.sh; present on the base image, listed so a
# thinner image still works.
BUILD_PACKAGES=(gcc make libc6-dev dpkg-dev xz-utils binutils)
PIP_MODULES="scgi flup"

missing=()
for p in "${APT_PACKAGES[@]}" "${BUILD_PACKAGES[@]}"; do
    status="$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)"
    if [ "$status" != "install ok installed" ]; then
        missing+=("$p")
    fi
done

if [ "${#missing[@]}" -gt 0 ]; then
    log "installing: ${missing[*]}"
    # Forbid maintainer scripts from starting php-fpm, nginx, apache2,
    # lighttpd or caddy: they would hold port 80 and a php-fpm socket on a
    # machine that runs our tests.
    policy=/usr/sbin/policy-rc.d
    made_policy=0
    if [ ! -e "$policy" ]; then
        printf '#!/bin/sh\nexit 101\n' >"$policy"
        chmod 0755 "$policy"
        made_policy=1
    fi
    restore_policy() { if [ "$made_policy" = 1 ]; then rm -f "$policy"; fi; }
    trap restore_policy EXIT
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/tmp/corral-apt.log 2>&1 ||
        { tail -n 40 /tmp/corral-apt.log >&2; exit 1; }
    restore_policy
    trap - EXIT
    # If a policy-rc.d of the image allowed starts, stop what the install
    # started, by the packages' own pid files.
    for pidfile in /run/nginx.pid /run/php/php8.2-fpm.pid /run/apache2/apache2.pid \
        /run/lighttpd.pid /run/mysqld/mysqld.pid; do
        if [ -s "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then
            log "stopping the daemon the install started ($pidfile)"
            kill -TERM "$(cat "$pidfile")" || true
        fi
    done
    # Caddy's package has only a systemd unit (no pid file): where systemd runs,
    # stop it and the others and keep them from starting at boot, so none holds
    # port 80 (the tests run their own, on free ports).
    if [ -d /run/systemd/system ]; then
        for unit in apache2 lighttpd caddy mariadb; do
            if systemctl is-active --quiet "$unit" 2>/dev/null; then
                log "stopping $unit, which the install started"
                systemctl stop "$unit" || true
            fi
            systemctl disable --quiet "$unit" 2>/dev/null || true
        done
    fi
    log "apt packages installed ($((SECONDS - start)) s)"
else
    log "apt packages present"
fi

if python3 -c 'import scgi, flup' 2>/dev/null; then
    log "python modules present ($(command -v python3))"
else
    log "pip installing $PIP_MODULES into $(command -v python3)"
    pip_install() {
        # shellcheck disable=SC2086
        python3 -m pip install --quiet --disable-pip-version-check \
            --root-user-action=ignore "$@" $PIP_MODULES
    }
    # Debian's own python3 is "externally managed" (PEP 668); a pyenv or
    # venv python3 is not.
    pip_install || pip_install --break-system-packages
    python3 -c 'import scgi, flup'
fi
# Granian, the WSGI server benches/launchers.sh compares against, from PyPI into a venv of
# Debian's own python3 (the interpreter uWSGI's plugin and the bench's corral pool use), so
# every Python row runs the same interpreter.
GRANIAN_VENV=/var/cache/corral/granian
if [ -x "$GRANIAN_VENV/bin/granian" ]; then
    log "granian present ($("$GRANIAN_VENV/bin/granian" --version))"
else
    log "pip installing granian into $GRANIAN_VENV"
    rm -rf "$GRANIAN_VENV"
    /usr/bin/python3 -m venv "$GRANIAN_VENV"
    "$GRANIAN_VENV/bin/pip" install --quiet --disable-pip-version-check 'granian>=2,<3'
fi
bash "$here/build-lsphp.sh"

log "done in $((SECONDS - start)) s"
