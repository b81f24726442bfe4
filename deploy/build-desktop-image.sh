#!/usr/bin/env bash
# build-desktop-image.sh: build the local Docker image for computers with a graphical desktop
# (X server, VNC, window manager, Chromium, Tk) on top of the sandbox image, without any
# registry.
#
# The desktop image is the sandbox image (deploy/build-sandbox-image.sh: Python, Node, git,
# build tools, C.UTF-8, no setuid programs) plus one layer, so a desktop sandbox has every tool
# a plain one has and the two images share their base layer on disk:
#
#   1. a container of the base image (computerd-sandbox:latest) runs, as root, with the host's
#      .deb cache bind-mounted: apt-get update, dist-upgrade and install, without recommends:
#      python3-tk, xvfb, xauth, x11-utils, x11-xkb-utils, x11vnc, openbox, xterm,
#      fonts-dejavu-core, chromium, dbus-x11 (a session bus that does not pull in systemd the
#      way dbus-user-session does). The base image's dpkg filter (no docs, man pages or
#      non-English translations) applies, plus Chromium's non-English locale packs;
#   2. the desktop's own account `computerd-desktop` (uid/gid 990: the agent runs the display,
#      the window manager and the VNC server as it, never root or `user`), /tmp/.X11-unix 1777
#      (a non-root X server creates its socket there), an empty Debian menu for openbox, and
#      xterm drawn with DejaVu Sans Mono through Xft (the X server's built-in font has no `€`
#      or `→`; the locale is the base's C.UTF-8);
#   3. the base's hardening again: setuid/setgid bits that the new packages set are stripped;
#   4. a smoke test (Xvfb, x11vnc, openbox, chromium, tkinter), then `docker commit` with
#      CMD/ENV/WORKDIR and two labels: computerd.build-script (SHA-256 of this script) and
#      computerd.base-image (the base image's id), by which tests/src/docker.rs rebuilds a
#      desktop image built by another version of this script or on another base.
#
# Downloaded .debs and apt's lists are kept between runs in /var/cache/computerd-desktop-debs
# (bind-mounted into the build container, never committed), so a rebuild only downloads what
# changed. Concurrent builds sharing the cache wait for each other (flock).
#
# Usage: deploy/build-desktop-image.sh [--agent PATH | --no-agent] [--tag TAG] [--base IMAGE]
#   --agent PATH  computer-agent binary (default: <repo>/target/release/computer-agent if it
#                 exists, else <repo>/target/debug/computer-agent; it is never built here)
#   --no-agent    install a placeholder /usr/local/bin/computer-agent that exits 1 instead (for
#                 tests that bind-mount the real binary over it)
#   --tag TAG     image tag (default: computerd-desktop:latest)
#   --base IMAGE  the image to build on (default: computerd-sandbox:latest; built with
#                 deploy/build-sandbox-image.sh and the same agent when it is missing)
#
# Must run as root (or a member of the docker group) on a host with Docker; the build container
# reaches the Debian mirror that the base image's apt sources name. Idempotent: re-running
# re-tags and drops the previous image if nothing else uses it. Takes about a minute and a half
# (most of it dpkg unpacking Chromium, Mesa and X), and adds ~500 MB to the base image (Chromium
# alone ~350 MB; Mesa/LLVM, which Xvfb's GLX needs, ~160 MB).
set -euo pipefail
shopt -s nullglob

SCRIPT_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd -P)"
REPO_ROOT="$(cd -- "$SCRIPT_DIR/.." && pwd -P)"
# The image's label computerd.build-script: which version of this script built it.
SCRIPT_SHA256="$(sha256sum -- "${BASH_SOURCE[0]}" | cut -d ' ' -f 1)"

die() { echo "build-desktop-image: error: $*" >&2; exit 1; }
warn() { echo "build-desktop-image: warning: $*" >&2; }
log() { echo "build-desktop-image: $*" >&2; }

usage() { sed -n '/^# Usage:/,/^#$/{/^#$/d;s/^# \{0,1\}//p}' "${BASH_SOURCE[0]}"; }

CACHE_DIR=/var/cache/computerd-desktop-debs
PACKAGES=(
    python3-tk
    xvfb xauth x11-utils x11-xkb-utils   # X server, xauth cookies, xdpyinfo/xwininfo, xkbcomp
    x11vnc openbox xterm fonts-dejavu-core
    chromium
    dbus-x11   # a session bus for GTK/dconf without dbus-user-session, which drags in systemd
)

AGENT=""
NO_AGENT=0
TAG="computerd-desktop:latest"
BASE="computerd-sandbox:latest"
while (($#)); do
    case "$1" in
        --agent) (($# >= 2)) || die "--agent needs a PATH"; AGENT="$2"; shift 2 ;;
        --agent=*) AGENT="${1#--agent=}"; shift ;;
        --no-agent) NO_AGENT=1; shift ;;
        --tag) (($# >= 2)) || die "--tag needs a TAG"; TAG="$2"; shift 2 ;;
        --tag=*) TAG="${1#--tag=}"; shift ;;
        --base) (($# >= 2)) || die "--base needs an IMAGE"; BASE="$2"; shift 2 ;;
        --base=*) BASE="${1#--base=}"; shift ;;
        -h|--help) usage; exit 0 ;;
        *) usage >&2; die "unknown argument: $1" ;;
    esac
done
[[ -n "$TAG" ]] || die "--tag must not be empty"
[[ -n "$BASE" ]] || die "--base must not be empty"
((NO_AGENT == 0)) || [[ -z "$AGENT" ]] || die "--agent and --no-agent exclude each other"

# ---- preconditions -------------------------------------------------------------------------

command -v docker >/dev/null 2>&1 || die "docker is not installed (no 'docker' command on PATH)"
docker info >/dev/null 2>&1 || die "cannot talk to the Docker daemon ('docker info' failed); is dockerd running?"
for tool in flock numfmt sha256sum; do
    command -v "$tool" >/dev/null 2>&1 || die "'$tool' not found"
done

if ((NO_AGENT)); then
    AGENT_DESC="placeholder agent"
else
    if [[ -z "$AGENT" ]]; then
        if [[ -f "$REPO_ROOT/target/release/computer-agent" ]]; then
            AGENT="$REPO_ROOT/target/release/computer-agent"
        elif [[ -f "$REPO_ROOT/target/debug/computer-agent" ]]; then
            AGENT="$REPO_ROOT/target/debug/computer-agent"
        else
            die "no computer-agent binary: neither $REPO_ROOT/target/release/computer-agent nor" \
                "$REPO_ROOT/target/debug/computer-agent exists (build it with cargo first, pass" \
                "--agent PATH, or --no-agent for a placeholder)"
        fi
    fi
    [[ -f "$AGENT" ]] || die "agent binary not found: $AGENT"
    [[ -x "$AGENT" ]] || die "agent binary is not executable: $AGENT"
    AGENT_DESC="$(basename -- "$AGENT")"
fi

if ! docker image inspect "$BASE" >/dev/null 2>&1; then
    [[ "$BASE" == computerd-sandbox:latest ]] ||
        die "the base image $BASE does not exist (build it first, or leave out --base)"
    log "the base image $BASE is missing: building it with build-sandbox-image.sh"
    agent_args=()
    if ((NO_AGENT == 0)); then agent_args=(--agent "$AGENT"); fi
    "$SCRIPT_DIR/build-sandbox-image.sh" "${agent_args[@]}" --tag "$BASE" >&2
fi
BASE_ID="$(docker image inspect -f '{{.Id}}' "$BASE")"
log "building on $BASE ($BASE_ID)"

# ---- cache, build container, cleanup ---------------------------------------------------------

mkdir -p "$CACHE_DIR/archives/partial" "$CACHE_DIR/lists/partial"
exec 9>"$CACHE_DIR/.lock"
if ! flock -n 9; then
    log "waiting for another build that uses $CACHE_DIR"
    flock 9
fi

BUILDER="computerd-desktop-build-$$-$RANDOM"
STAGE="$(mktemp -d "${TMPDIR:-/tmp}/computerd-desktop.XXXXXX")"
cleanup() {
    docker rm -f -v "$BUILDER" >/dev/null 2>&1 || true
    rm -rf -- "$STAGE"
}
trap cleanup EXIT
set -E
trap 'warn "command failed (line $LINENO): $BASH_COMMAND"' ERR
trap 'warn interrupted; exit 130' INT
trap 'warn terminated; exit 143' TERM HUP

start_s=$SECONDS
phase_s=$SECONDS
phase_done() { log "$1 took $((SECONDS - phase_s))s"; phase_s=$SECONDS; }

# The build container: root with Docker's default capabilities (apt and useradd need them; the
# sandboxes that run the image have none), sleeping until the steps below are done in it.
docker create --name "$BUILDER" \
    -v "$CACHE_DIR/archives:/var/cache/apt/archives" \
    -v "$CACHE_DIR/lists:/var/lib/apt/lists" \
    "$BASE" /bin/sleep infinity >/dev/null
docker start "$BUILDER" >/dev/null

# in_builder NAME: run the bash script on stdin in the build container, its output in
# $STAGE/NAME.log; on failure show the log's tail.
in_builder() {
    local name="$1"
    if ! docker exec -i --user 0:0 \
        -e DEBIAN_FRONTEND=noninteractive -e DEBCONF_NONINTERACTIVE_SEEN=true -e LC_ALL=C.UTF-8 \
        "$BUILDER" bash -euo pipefail -s >"$STAGE/$name.log" 2>&1; then
        tail -n 40 "$STAGE/$name.log" >&2
        die "$name failed (last lines above)"
    fi
}

# ---- 1. packages -------------------------------------------------------------------------------

log "apt-get install ${PACKAGES[*]}"
in_builder apt <<EOS
# dpkg without fsync()s while building (removed again below), and no daemon may start.
echo force-unsafe-io >/etc/dpkg/dpkg.cfg.d/computerd-build-unsafe-io
printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
chmod 0755 /usr/sbin/policy-rc.d
cat >/etc/dpkg/dpkg.cfg.d/computerd-slim-desktop <<'EOT'
# computerd desktop image: Chromium's English locale packs only.
path-exclude /usr/lib/chromium/locales/*
path-include /usr/lib/chromium/locales/en-US.pak*
path-include /usr/lib/chromium/locales/en-GB.pak*
EOT
APT=(apt-get -q -y --no-install-recommends
     -o APT::Sandbox::User=root -o APT::Keep-Downloaded-Packages=true
     -o Acquire::Languages=none -o Acquire::Retries=3 -o Dpkg::Use-Pty=0
     -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold)
"\${APT[@]}" update
"\${APT[@]}" dist-upgrade
"\${APT[@]}" install ${PACKAGES[*]}
# Prune the host cache of versions the mirror no longer has (never apt-get clean: the
# archives dir is the host cache).
"\${APT[@]}" autoclean
echo "packages installed: \$(dpkg-query -W -f='\${db:Status-Abbrev}\n' | grep -c '^ii')"
EOS
grep -h '^Fetched \|^packages installed' "$STAGE/apt.log" | sed 's/^/build-desktop-image: /' >&2 || true
phase_done "apt"

# ---- 2. the desktop's account, X, xterm; 3. hardening -------------------------------------------

in_builder setup <<'EOS'
groupadd -r -g 990 computerd-desktop
useradd -r -u 990 -g 990 -M -d /run/computerd-desktop -s /usr/sbin/nologin -c "computerd desktop" computerd-desktop
mkdir -p /tmp/.X11-unix
chmod 1777 /tmp /tmp/.X11-unix
# Openbox's rc.xml includes the menu that Debian's `menu` package (a recommendation, left out)
# would generate; an empty one keeps openbox from complaining at every start.
if [ -d /etc/xdg/openbox ] && [ ! -e /var/lib/openbox/debian-menu.xml ]; then
    mkdir -p /var/lib/openbox
    cat >/var/lib/openbox/debian-menu.xml <<'EOT'
<?xml version="1.0" encoding="UTF-8"?>
<openbox_menu xmlns="http://openbox.org/3.4/menu">
  <menu id="/Debian" label="Debian" />
</openbox_menu>
EOT
fi
# xterm through Xft with a font that has the glyphs (the X server's built-in "fixed" is Latin-1
# only), in UTF-8 whatever the locale says.
[ -f /etc/X11/app-defaults/XTerm ] || { echo "no /etc/X11/app-defaults/XTerm" >&2; exit 1; }
cat >>/etc/X11/app-defaults/XTerm <<'EOT'

! computerd desktop image: draw with DejaVu Sans Mono (Xft), in UTF-8.
*faceName: DejaVu Sans Mono
*faceSize: 11
*utf8: 1
*locale: UTF-8
EOT
rm -f /usr/sbin/policy-rc.d /etc/dpkg/dpkg.cfg.d/computerd-build-unsafe-io
rm -rf /var/cache/apt/*.bin /var/log/apt/* /var/cache/debconf/*-old /var/lib/dpkg/*-old \
       /var/cache/ldconfig/aux-cache /root/.cache
rm -f /var/log/dpkg.log /var/log/alternatives.log
find /tmp /var/tmp -mindepth 1 -maxdepth 1 ! -name .X11-unix -exec rm -rf -- {} +
if [ -d /usr/share/locale ]; then
    find /usr/share/locale -mindepth 1 -maxdepth 1 ! -name 'en*' ! -name locale.alias -exec rm -rf -- {} +
fi
if [ -e /etc/machine-id ]; then : >/etc/machine-id; fi
rm -f /var/lib/dbus/machine-id
# No setuid/setgid programs, as in the base image.
suid="$(find / -xdev -perm /6000 -type f -printf '%p ' -exec chmod ug-s {} +)"
echo "stripped setuid/setgid bits: ${suid:-none}"
[ -z "$(find / -xdev -perm /6000 -type f -print -quit)" ]
EOS
grep -h '^stripped' "$STAGE/setup.log" | sed 's/^/build-desktop-image: /' >&2 || true

if ((NO_AGENT)); then
    cat >"$STAGE/computer-agent" <<'EOF'
#!/bin/sh
# Placeholder from build-desktop-image.sh --no-agent: bind-mount the real binary over this file.
echo "computer-agent: placeholder (image built with --no-agent); mount the real binary at $0" >&2
exit 1
EOF
    chmod 0755 "$STAGE/computer-agent"
else
    install -m 0755 "$AGENT" "$STAGE/computer-agent"
fi
# The same binary as the base's is not copied again (it would add its size to the layer).
base_agent="$(docker exec "$BUILDER" sha256sum /usr/local/bin/computer-agent 2>/dev/null | cut -d ' ' -f 1 || true)"
if [[ "$base_agent" != "$(sha256sum -- "$STAGE/computer-agent" | cut -d ' ' -f 1)" ]]; then
    docker cp "$STAGE/computer-agent" "$BUILDER:/usr/local/bin/computer-agent"
    in_builder agent <<'EOS'
chown 0:0 /usr/local/bin/computer-agent
chmod 0755 /usr/local/bin/computer-agent
EOS
    log "agent: $AGENT_DESC"
else
    log "agent: the base image's (the same binary)"
fi
phase_done "setup"

# ---- 4. smoke test, commit ---------------------------------------------------------------------

smoke() {   # smoke PATTERN CMD...: CMD must succeed and print a line matching PATTERN (in REPLY)
    local pattern="$1" out
    shift
    if ! out="$(docker exec --user 0:0 -e LC_ALL=C.UTF-8 "$BUILDER" "$@" 2>&1)" ||
        ! REPLY="$(grep -m 1 -E -- "$pattern" <<<"$out")"; then
        printf '%s\n' "$out" | tail -n 20 >&2
        die "smoke test in the build container failed: $*"
    fi
    log "smoke: $REPLY"
}
smoke '^use: X' Xvfb -help
smoke '^x11vnc: [0-9]' x11vnc -version
smoke '^Openbox [0-9]' openbox --version
smoke '^Chromium [0-9]' chromium --version
smoke '^tkinter [0-9]' python3 -c 'import tkinter; print("tkinter", tkinter.TkVersion)'
smoke '^DejaVuSansMono.ttf$' sh -c 'cd /usr/share/fonts/truetype/dejavu && ls DejaVuSansMono.ttf'
smoke '^uid=990\(computerd-desktop\)' sh -c 'command -v xdpyinfo xauth xkbcomp xterm git node >/dev/null && id computerd-desktop'
docker stop -t 1 "$BUILDER" >/dev/null

old_id="$(docker image inspect -f '{{.Id}}' "$TAG" 2>/dev/null || true)"
new_id="$(docker commit \
    --change 'ENV PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin' \
    --change 'ENV HOME=/root' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'WORKDIR /root' \
    --change 'CMD ["/usr/local/bin/computer-agent"]' \
    --change "LABEL computerd.build-script=$SCRIPT_SHA256" \
    --change "LABEL computerd.base-image=$BASE_ID" \
    --message "computerd desktop: $BASE + ${PACKAGES[*]} + $AGENT_DESC" \
    "$BUILDER")"
phase_done "commit"
config="$(docker image inspect -f '{{json .Config.Entrypoint}} {{json .Config.Cmd}} {{json .Config.User}}' "$new_id")"
[[ "$config" == 'null ["/usr/local/bin/computer-agent"] ""' ]] ||
    die "the committed image does not start the agent as root (entrypoint, cmd, user: $config)"
docker tag "$new_id" "$TAG"
# Drop the image this tag used to point at, unless a container or another tag still uses it.
if [[ -n "$old_id" && "$old_id" != "$new_id" ]]; then
    docker image rm "$old_id" >/dev/null 2>&1 || true
fi
size="$(docker image inspect -f '{{.Size}}' "$TAG")"
base_size="$(docker image inspect -f '{{.Size}}' "$BASE")"
human() { numfmt --to=si --suffix=B "$1" 2>/dev/null || echo "$1 bytes"; }
log "done in $((SECONDS - start_s))s"
echo "image: $TAG"
echo "id:    $new_id"
echo "size:  $(human "$size") ($size bytes; $(human $((size - base_size))) on top of $BASE)"
