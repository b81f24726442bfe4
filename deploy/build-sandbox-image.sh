#!/usr/bin/env bash
# build-sandbox-image.sh: build the local Docker image that computerd's Docker provider runs
# bots' computers in (computerd-sandbox:latest), without any registry, with the tools agents
# reach for.
#
# Why: this machine cannot reach a registry, so `docker pull` and `FROM debian` are impossible.
# As build-desktop-image.sh does, this builds a real Debian bookworm rootfs with `debootstrap`
# from the Debian mirror the host's apt already uses (found in /etc/apt/sources.list{,.d/*};
# default http://deb.debian.org/debian), and keeps dpkg and apt in it, so that a root session
# or a template (a Dockerfile `FROM computerd-sandbox:latest`) can `apt-get install` more:
#
#   1. `debootstrap --variant=minbase --merged-usr bookworm` into a temporary staging rootfs
#      (dpkg with --force-unsafe-io while building: the build's time is mostly dpkg's);
#   2. inside a chroot (with /proc mounted), apt-get update, dist-upgrade (bookworm-updates and
#      bookworm-security, when the host uses them) and install, without recommends: python3
#      with pip and venv, nodejs and npm, git, curl, wget, ca-certificates, build-essential, jq,
#      ripgrep, unzip, zip, procps, util-linux (setsid), less, vim-tiny and nano,
#      openssh-client, sqlite3, openssl, netbase, tzdata, and iptables (for the egress gateway,
#      which runs the same image with NET_ADMIN; a sandbox has no NET_ADMIN, so its own
#      iptables can change nothing). A dpkg filter
#      (/etc/dpkg/dpkg.cfg.d/computerd-slim, kept in the image) leaves out docs (except
#      copyright files), man/info pages and translations other than English;
#   3. the same dead weight is deleted from the debootstrap'd base packages, plus apt lists and
#      caches and logs. Debian's PEP 668 marker (/usr/lib/python3.*/EXTERNALLY-MANAGED) is
#      removed: the sandbox's Python is the user's, so `pip install --user` works as `user`, and
#      /etc/profile.d/computerd.sh puts ~/.local/bin first on PATH and sets LANG=C.UTF-8 for
#      login shells (sessions run `bash -lc`; the C.UTF-8 locale is glibc's built-in one);
#   4. the layout the Docker provider and the agent rely on: root, `user` (uid/gid 1000,
#      /home/user, bash, also in `users`), nobody (and Debian's own system accounts),
#      /workspace (user's, 0755: sessions' working directory), the agent's root-only
#      /var/lib/computer-agent (0700), /tmp 1777, empty /dev, /etc/resolv.conf and /etc/hosts
#      (Docker provides them), and the agent as /usr/local/bin/computer-agent. Hardening: the
#      provider runs the container with no capabilities and no-new-privileges, and the image
#      has no setuid/setgid programs: the bits that packages set (passwd's passwd/chsh/chfn/
#      gpasswd/newgrp, mount/umount/su, ssh-keysign, unix_chkpwd, chage/expiry, ...) are
#      stripped (`find / -xdev -perm /6000 -type f -exec chmod ug-s {} +` in the rootfs). A
#      package installed later by root may set such bits again; no-new-privileges keeps them
#      inert;
#   5. a smoke test in the chroot (python3 + pip + venv, node + npm, git, gcc, curl, rg, jq, ...),
#      then the tree is streamed into `docker import` with PATH/HOME/LANG/WORKDIR/CMD set and
#      the label computerd.build-script=<SHA-256 of this script>, by which tests/src/docker.rs
#      rebuilds an image built by an older version of this script.
#
# Downloaded .debs (debootstrap's and apt's: one directory, same file names) and apt's lists are
# kept between runs in /var/cache/computerd-sandbox-debs (bind-mounted into the chroot; apt's
# autoclean drops the versions the mirror no longer has), so a rebuild only downloads what
# changed. Concurrent builds sharing the cache wait for each other (flock).
#
# Usage: deploy/build-sandbox-image.sh [--agent PATH] [--tag TAG] [--mirror URL]
#   --agent PATH  computer-agent binary (default: <repo>/target/release/computer-agent if it
#                 exists, else <repo>/target/debug/computer-agent; it is never built here)
#   --tag TAG     image tag (default: computerd-sandbox:latest)
#   --mirror URL  Debian mirror (default: the host apt's bookworm mirror)
#
# Must run as root on a Debian host with Docker and debootstrap (apt-get install debootstrap).
# Idempotent: re-running re-tags and drops the previous image if nothing else uses it.
# Takes about 2.5 minutes the first time (~170 MB of downloads) and about 2 minutes with the
# cache: most of it is dpkg unpacking and configuring ~560 packages, which happens on every run.
# The image is ~750 MB (gcc/g++ and binutils ~250 MB; nodejs and npm, which Debian splits into
# ~350 node-* packages, ~200 MB; git and perl ~100 MB; the agent itself, ~85 MB as a debug build).
set -euo pipefail
shopt -s nullglob

SCRIPT_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd -P)"
REPO_ROOT="$(cd -- "$SCRIPT_DIR/.." && pwd -P)"
# The image's label: which version of this script built it.
SCRIPT_SHA256="$(sha256sum -- "${BASH_SOURCE[0]}" | cut -d ' ' -f 1)"

die() { echo "build-sandbox-image: error: $*" >&2; exit 1; }
warn() { echo "build-sandbox-image: warning: $*" >&2; }
log() { echo "build-sandbox-image: $*" >&2; }

usage() { sed -n '/^# Usage:/,/^#$/{/^#$/d;s/^# \{0,1\}//p}' "${BASH_SOURCE[0]}"; }

SUITE=bookworm
CACHE_DIR=/var/cache/computerd-sandbox-debs
PACKAGES=(
    bash coreutils procps util-linux less vim-tiny nano
    python3 python3-pip python3-venv
    nodejs npm
    git curl wget ca-certificates openssh-client openssl netbase
    build-essential
    jq ripgrep unzip zip sqlite3
    tzdata
    iptables
)

AGENT=""
TAG="computerd-sandbox:latest"
MIRROR=""
while (($#)); do
    case "$1" in
        --agent) (($# >= 2)) || die "--agent needs a PATH"; AGENT="$2"; shift 2 ;;
        --agent=*) AGENT="${1#--agent=}"; shift ;;
        --tag) (($# >= 2)) || die "--tag needs a TAG"; TAG="$2"; shift 2 ;;
        --tag=*) TAG="${1#--tag=}"; shift ;;
        --mirror) (($# >= 2)) || die "--mirror needs a URL"; MIRROR="$2"; shift 2 ;;
        --mirror=*) MIRROR="${1#--mirror=}"; shift ;;
        -h|--help) usage; exit 0 ;;
        *) usage >&2; die "unknown argument: $1" ;;
    esac
done
[[ -n "$TAG" ]] || die "--tag must not be empty"

# ---- preconditions -------------------------------------------------------------------------

[[ $EUID -eq 0 ]] || die "must run as root (debootstrap, chroot and mounts need it)"
command -v docker >/dev/null 2>&1 || die "docker is not installed (no 'docker' command on PATH)"
docker info >/dev/null 2>&1 || die "cannot talk to the Docker daemon ('docker info' failed); is dockerd running?"
command -v debootstrap >/dev/null 2>&1 ||
    die "debootstrap is not installed; install it with: apt-get install debootstrap"
[[ -e "/usr/share/debootstrap/scripts/$SUITE" ]] ||
    die "this debootstrap does not know $SUITE (no /usr/share/debootstrap/scripts/$SUITE); upgrade it"
for tool in chroot mount umount mountpoint findmnt flock dpkg tar numfmt sha256sum; do
    command -v "$tool" >/dev/null 2>&1 || die "'$tool' not found; this script needs a Debian host"
done
ARCH="$(dpkg --print-architecture)"
[[ "$ARCH" == amd64 ]] || warn "written for amd64, this host is $ARCH"

if [[ -z "$AGENT" ]]; then
    if [[ -f "$REPO_ROOT/target/release/computer-agent" ]]; then
        AGENT="$REPO_ROOT/target/release/computer-agent"
    elif [[ -f "$REPO_ROOT/target/debug/computer-agent" ]]; then
        AGENT="$REPO_ROOT/target/debug/computer-agent"
    else
        die "no computer-agent binary: neither $REPO_ROOT/target/release/computer-agent nor" \
            "$REPO_ROOT/target/debug/computer-agent exists (build it with cargo first, or pass --agent PATH)"
    fi
fi
[[ -f "$AGENT" ]] || die "agent binary not found: $AGENT"
[[ -x "$AGENT" ]] || die "agent binary is not executable: $AGENT"

# ---- mirrors ---------------------------------------------------------------------------------

# Print "URI SUITE" for every enabled `deb` source of the host's apt, one-line (.list) and
# deb822 (.sources) formats alike.
host_sources() {
    local lists=() deb822=()
    [[ -f /etc/apt/sources.list ]] && lists+=(/etc/apt/sources.list)
    lists+=(/etc/apt/sources.list.d/*.list)
    deb822+=(/etc/apt/sources.list.d/*.sources)
    if ((${#lists[@]})); then
        awk '{ sub(/#.*/, "") }
             $1 == "deb" {
                 i = 2
                 if ($i ~ /^\[/) { while (i <= NF && $i !~ /\]$/) i++; i++ }
                 if (i + 1 <= NF) print $i, $(i + 1)
             }' "${lists[@]}"
    fi
    if ((${#deb822[@]})); then
        awk 'BEGIN { RS = ""; FS = "\n" }
             {
                 types = uris = suites = ""; enabled = "yes"
                 for (l = 1; l <= NF; l++) {
                     line = $l
                     if (line ~ /^#/) continue
                     if (sub(/^Types:[ \t]*/, "", line)) types = line
                     else if (sub(/^URIs:[ \t]*/, "", line)) uris = line
                     else if (sub(/^Suites:[ \t]*/, "", line)) suites = line
                     else if (sub(/^Enabled:[ \t]*/, "", line)) enabled = tolower(line)
                 }
                 if (enabled == "no" || (" " types " ") !~ / deb /) next
                 nu = split(uris, u, /[ \t]+/); ns = split(suites, s, /[ \t]+/)
                 for (a = 1; a <= nu; a++) for (b = 1; b <= ns; b++)
                     if (u[a] != "" && s[b] != "") print u[a], s[b]
             }' "${deb822[@]}"
    fi
}

SOURCES="$(host_sources 2>/dev/null || true)"
pick_uri() {   # pick_uri SUITE -> first http(s) URI the host uses for SUITE
    awk -v s="$1" '$2 == s && $1 ~ /^https?:\/\// { sub(/\/+$/, "", $1); print $1; exit }' <<<"$SOURCES"
}
if [[ -z "$MIRROR" ]]; then
    MIRROR="$(pick_uri "$SUITE")"
    if [[ -z "$MIRROR" ]]; then
        MIRROR=http://deb.debian.org/debian
        warn "no $SUITE source in the host's apt configuration, using $MIRROR"
    fi
fi
MIRROR="${MIRROR%/}"
SECURITY_MIRROR="$(pick_uri "$SUITE-security")"
UPDATES=0
if [[ -z "$SOURCES" ]]; then
    # No host apt sources at all: use Debian's standard layout.
    SECURITY_MIRROR=http://deb.debian.org/debian-security
    UPDATES=1
elif [[ -n "$(awk -v s="$SUITE-updates" '$2 == s { print; exit }' <<<"$SOURCES")" ]]; then
    UPDATES=1
fi
[[ -n "$SECURITY_MIRROR" ]] || warn "the host has no $SUITE-security source; building without security updates"
log "mirror $MIRROR${SECURITY_MIRROR:+, security $SECURITY_MIRROR}"

# ---- cache, staging, cleanup -----------------------------------------------------------------

mkdir -p "$CACHE_DIR/archives/partial" "$CACHE_DIR/lists/partial"
exec 9>"$CACHE_DIR/.lock"
if ! flock -n 9; then
    log "waiting for another build that uses $CACHE_DIR"
    flock 9
fi

# Not /tmp: it may be a small tmpfs, and the rootfs is several hundred MB.
STAGE="$(mktemp -d "${TMPDIR:-/var/tmp}/computerd-sandbox.XXXXXX")"
ROOTFS="$STAGE/rootfs"
R="$ROOTFS"
MOUNTS=()

mount_tracked() {   # mount ARGS... TARGET; TARGET is unmounted again by unmount_all
    mount "$@"
    MOUNTS+=("${!#}")
}

unmount_all() {
    local i m
    for ((i = ${#MOUNTS[@]} - 1; i >= 0; i--)); do
        m="${MOUNTS[i]}"
        if mountpoint -q "$m"; then
            umount "$m" 2>/dev/null || umount -l "$m" || warn "could not unmount $m"
        fi
    done
    MOUNTS=()
}

# Anything still mounted below the staging dir (ours, or debootstrap's after a crash).
stage_mounts() { findmnt -rn -o TARGET | awk -v p="$STAGE/" 'index($0, p) == 1' | sort -r; }

cleanup() {
    local m left
    unmount_all
    while IFS= read -r m; do
        if [[ -n "$m" ]]; then umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true; fi
    done < <(stage_mounts)
    left="$(stage_mounts)"
    if [[ -n "$left" ]]; then
        # Never rm -rf through a live bind mount: it would empty the .deb cache (or worse).
        warn "not removing $STAGE, still mounted below it: $(echo $left)"
    else
        rm -rf --one-file-system -- "$STAGE"
    fi
}
trap cleanup EXIT
set -E   # the ERR trap below also fires inside functions
trap 'warn "command failed (line $LINENO): $BASH_COMMAND"' ERR
trap 'warn interrupted; exit 130' INT
trap 'warn terminated; exit 143' TERM HUP

# run_logged NAME CMD...: run CMD with its output in $STAGE/NAME.log; on failure show its tail.
run_logged() {
    local name="$1"; shift
    if ! "$@" >"$STAGE/$name.log" 2>&1; then
        tail -n 40 "$STAGE/$name.log" >&2
        die "$name failed (last lines above)"
    fi
}

# in_chroot CMD...: run CMD in the rootfs with a clean environment.
in_chroot() {
    chroot "$R" /usr/bin/env -i \
        PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin HOME=/root LC_ALL=C.UTF-8 \
        DEBIAN_FRONTEND=noninteractive DEBCONF_NONINTERACTIVE_SEEN=true "$@"
}

APT_OPTS=(
    -q -y --no-install-recommends
    -o APT::Sandbox::User=root            # the bind-mounted cache stays root's on the host
    -o APT::Keep-Downloaded-Packages=true # the point of the cache
    -o Acquire::Languages=none            # no Translation-* indexes
    -o Acquire::Retries=3
    -o Dpkg::Use-Pty=0
    -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold
)

start_s=$SECONDS
phase_s=$SECONDS
phase_done() { log "$1 took $((SECONDS - phase_s))s"; phase_s=$SECONDS; }

# ---- 1. debootstrap ----------------------------------------------------------------------------

# apt's and debootstrap's .deb names agree (name_version_arch.deb, epoch ':' as %3a), so both
# use the same directory; debootstrap copies the debs it uses into the target.
INCLUDE=()
if [[ "$MIRROR" == https://* ]]; then INCLUDE=(--include=ca-certificates); fi   # apt needs it for https
log "debootstrap --variant=minbase $SUITE ($ARCH) from $MIRROR"
# Two stages, so that dpkg can be told to skip its fsync()s (a throw-away tree: if the build
# dies, it is deleted anyway) before the base packages are installed; most of the build's time
# is dpkg's, not downloads. The setting is removed again before the import.
run_logged debootstrap debootstrap --foreign --variant=minbase --merged-usr --arch="$ARCH" \
    --components=main --cache-dir="$CACHE_DIR/archives" "${INCLUDE[@]}" "$SUITE" "$ROOTFS" "$MIRROR"
mkdir -p "$R/etc/dpkg/dpkg.cfg.d"
echo force-unsafe-io >"$R/etc/dpkg/dpkg.cfg.d/computerd-build-unsafe-io"
run_logged debootstrap-second-stage in_chroot /debootstrap/debootstrap --second-stage
phase_done "debootstrap"

# ---- 2. packages -------------------------------------------------------------------------------

{
    echo "deb $MIRROR $SUITE main"
    if ((UPDATES)); then echo "deb $MIRROR $SUITE-updates main"; fi
    if [[ -n "$SECURITY_MIRROR" ]]; then echo "deb $SECURITY_MIRROR $SUITE-security main"; fi
} >"$R/etc/apt/sources.list"
chmod 0644 "$R/etc/apt/sources.list"

# Kept in the image, so that packages installed later stay slim too (as in Debian's -slim images).
mkdir -p "$R/etc/dpkg/dpkg.cfg.d"
cat >"$R/etc/dpkg/dpkg.cfg.d/computerd-slim" <<'EOT'
# computerd sandbox image: no docs (but copyright files), man/info pages or non-English
# translations. Remove this file before installing a package whose docs you want.
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/lintian/*
path-exclude /usr/share/linda/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
path-include /usr/share/locale/en*
EOT
# No daemon may start inside the chroot.
printf '#!/bin/sh\nexit 101\n' >"$R/usr/sbin/policy-rc.d"
chmod 0755 "$R/usr/sbin/policy-rc.d"
cp -L /etc/resolv.conf "$R/etc/resolv.conf"   # for apt's downloads; emptied again below

rm -rf "${R:?}/var/cache/apt/archives" "${R:?}/var/lib/apt/lists"   # debootstrap's copies
mkdir -p "$R/var/cache/apt/archives" "$R/var/lib/apt/lists"
mount_tracked -t proc proc "$R/proc"
mount_tracked --bind "$CACHE_DIR/archives" "$R/var/cache/apt/archives"
mount_tracked --bind "$CACHE_DIR/lists" "$R/var/lib/apt/lists"

log "apt-get install ${PACKAGES[*]}"
run_logged apt-update in_chroot apt-get "${APT_OPTS[@]}" update
run_logged apt-upgrade in_chroot apt-get "${APT_OPTS[@]}" dist-upgrade
run_logged apt-install in_chroot apt-get "${APT_OPTS[@]}" install "${PACKAGES[@]}"
# Prune the host cache of versions the mirror no longer has (never `apt-get clean` here: the
# archives dir is the host cache).
run_logged apt-autoclean in_chroot apt-get "${APT_OPTS[@]}" autoclean
npkgs="$(in_chroot dpkg-query -W -f='${db:Status-Abbrev}\n' | grep -c '^ii')"
fetched="$(cat "$STAGE"/apt-upgrade.log "$STAGE"/apt-install.log | grep -h '^Fetched ' | tr '\n' ' ' || true)"
log "debootstrap downloaded $(grep -cE '^I: Retrieving [^ ]+ [^ ]+' "$STAGE/debootstrap.log" || true) .debs;" \
    "apt: ${fetched:-nothing fetched (all cached)}"
umount "$R/var/lib/apt/lists"
umount "$R/var/cache/apt/archives"
phase_done "apt ($npkgs packages installed)"

# ---- 3. slimming, Python, login environment ----------------------------------------------------

rm -rf "${R:?}"/var/lib/apt/lists/* "${R:?}"/var/cache/apt/archives/* "${R:?}"/var/cache/apt/*.bin
mkdir -p "$R/var/lib/apt/lists/partial" "$R/var/cache/apt/archives/partial"
# What the dpkg filter did not catch (debootstrap installs before it exists).
for d in "$R/usr/share/doc" "$R/usr/share/man" "$R/usr/share/info" "$R/usr/share/lintian" \
         "$R/usr/share/linda"; do
    [[ -d "$d" ]] || continue
    find "$d" -mindepth 1 ! -type d ! -name copyright -delete
    if [[ "$d" == */doc ]]; then
        find "$d" -mindepth 1 -depth -type d -empty -delete
    else
        find "$d" -mindepth 1 ! -type d -delete
        find "$d" -mindepth 2 -depth -type d -empty -delete   # keep e.g. /usr/share/man/man1
    fi
done
if [[ -d "$R/usr/share/locale" ]]; then
    find "$R/usr/share/locale" -mindepth 1 -maxdepth 1 ! -name 'en*' ! -name locale.alias \
        -exec rm -rf -- {} +
fi
rm -rf "${R:?}"/var/log/apt/* "${R:?}"/var/cache/debconf/*-old "${R:?}"/var/lib/dpkg/*-old \
       "${R:?}"/var/cache/ldconfig/aux-cache "${R:?}"/tmp/* "${R:?}"/var/tmp/* "${R:?}"/root/.cache
rm -f "$R/var/log/dpkg.log" "$R/var/log/alternatives.log" "$R/var/log/bootstrap.log"
rm -f "$R/usr/sbin/policy-rc.d" "$R/etc/dpkg/dpkg.cfg.d/computerd-build-unsafe-io"
# A fresh machine id per container (Docker images ship none); see machine-id(5).
if [[ -e "$R/etc/machine-id" ]]; then : >"$R/etc/machine-id"; fi
rm -f "$R/var/lib/dbus/machine-id"

# PEP 668: the sandbox's Python is the user's to install into (pip install --user).
marker=("$R"/usr/lib/python3.*/EXTERNALLY-MANAGED)
((${#marker[@]})) || die "no /usr/lib/python3.*/EXTERNALLY-MANAGED (did python3 install?)"
rm -f -- "${marker[@]}"
# Login shells (sessions run `bash -lc`): /etc/profile resets PATH, then runs this.
cat >"$R/etc/profile.d/computerd.sh" <<'EOT'
# computerd sandbox: what `pip install --user` and `npm install -g --prefix ~/.local` install is
# on PATH, and text is UTF-8 unless the session says otherwise.
case ":$PATH:" in
    *":$HOME/.local/bin:"*) ;;
    *) [ -n "$HOME" ] && [ "$HOME" != / ] && PATH="$HOME/.local/bin:$PATH" ;;
esac
export PATH
: "${LANG:=C.UTF-8}"
export LANG
EOT
chmod 0644 "$R/etc/profile.d/computerd.sh"
echo 'LANG=C.UTF-8' >"$R/etc/default/locale"
phase_done "slimming"

# ---- 4. users, directories, agent, hardening ---------------------------------------------------

in_chroot sh -c 'command -v useradd >/dev/null' || die "useradd missing from the rootfs (passwd package)"
in_chroot groupadd -g 1000 user
in_chroot useradd -u 1000 -g 1000 -G users -m -d /home/user -s /bin/bash -c user user
mkdir -p "$R/workspace" "$R/var/lib/computer-agent" "$R/usr/local/bin" "$R/home/user/.local/bin"
chown 1000:1000 "$R/workspace"
chown -R 1000:1000 "$R/home/user"
chmod 0755 "$R/workspace" "$R/home/user" "$R/usr/local/bin"
chmod 0700 "$R/root"
# The agent's state (credential, tool runtime) is root's; the agent narrows it further at start.
chown 0:0 "$R/var/lib/computer-agent"
chmod 0700 "$R/var/lib/computer-agent"
chmod 1777 "$R/tmp" "$R/var/tmp"
install -m 0755 "$AGENT" "$R/usr/local/bin/computer-agent"

# Docker bind-mounts its own /etc/hosts, /etc/hostname and /etc/resolv.conf over these;
# debootstrap copied the host's resolv.conf and hostname, which must not leak into the image.
cat >"$R/etc/hosts" <<'EOT'
127.0.0.1	localhost
::1	localhost ip6-localhost ip6-loopback
EOT
echo sandbox >"$R/etc/hostname"
if [[ ! -e "$R/etc/localtime" && -e "$R/usr/share/zoneinfo/Etc/UTC" ]]; then
    ln -sfn /usr/share/zoneinfo/Etc/UTC "$R/etc/localtime"
    echo Etc/UTC >"$R/etc/timezone"
fi

# No setuid/setgid programs (see the header).
suid="$(find "$R" -xdev -perm /6000 -type f -printf '/%P ' -exec chmod ug-s {} +)"
log "stripped setuid/setgid bits: ${suid:-none}"
[[ -z "$(find "$R" -xdev -perm /6000 -type f -print -quit)" ]] || die "setuid/setgid files left in $R"
phase_done "users and hardening"

# ---- 5. smoke test in the chroot, before handing it to docker -------------------------------

smoke() {   # smoke PATTERN CMD...: CMD must succeed and print a line matching PATTERN (in REPLY)
    local pattern="$1" out
    shift
    if ! out="$(in_chroot "$@" 2>&1)" || ! REPLY="$(grep -m 1 -E -- "$pattern" <<<"$out")"; then
        printf '%s\n' "$out" | tail -n 20 >&2
        die "smoke test in the staged rootfs failed: $*"
    fi
    log "smoke: $REPLY"
}
smoke '^ok$' python3 -c 'import json, os, subprocess, ssl, sqlite3, decimal, zlib, hashlib, venv, ensurepip; print("ok")'
smoke '^pip [0-9]' python3 -m pip --version
smoke '^v[0-9]' node --version
smoke '^[0-9]+\.' npm --version
smoke '^git version' git --version
smoke '^gcc' gcc --version
smoke '^GNU Make' make --version
smoke '^curl [0-9]' curl --version
smoke '^GNU Wget' wget --version
smoke '^ripgrep [0-9]' rg --version
smoke '^jq-' jq --version
smoke '^iptables v1' iptables --version
smoke '^[0-9]+\.[0-9]+' sqlite3 --version
smoke '^setsid from util-linux' setsid --version
smoke '^OpenSSH' ssh -V
smoke '^C\.utf8$' locale -a
smoke '^uid=1000\(user\) gid=1000\(user\) groups=1000\(user\),100\(users\)$' id user
unmount_all
: >"$R/etc/resolv.conf"
# Docker mounts its own /dev (and /proc, /sys); drop debootstrap's device nodes.
rm -rf "${R:?}"/dev/* "${R:?}"/run/*
mkdir -p "$R/run/lock"
chmod 1777 "$R/run/lock"
[[ -z "$(stage_mounts)" ]] || die "something is still mounted in $R"

# ---- import ----------------------------------------------------------------------------------

old_id="$(docker image inspect -f '{{.Id}}' "$TAG" 2>/dev/null || true)"
log "importing $(du -sh "$R" | cut -f1) rootfs as $TAG"
new_id="$(tar -C "$R" --numeric-owner -cf - . | docker import \
    --change 'ENV PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin' \
    --change 'ENV HOME=/root' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'WORKDIR /root' \
    --change 'CMD ["/usr/local/bin/computer-agent"]' \
    --change "LABEL computerd.build-script=$SCRIPT_SHA256" \
    --message "computerd sandbox: debootstrap $SUITE ($MIRROR) + ${PACKAGES[*]} + $(basename -- "$AGENT")" \
    - "$TAG")"
phase_done "import"
# Drop the image this tag used to point at, unless a container or another tag still uses it.
if [[ -n "$old_id" && "$old_id" != "$new_id" ]]; then
    docker image rm "$old_id" >/dev/null 2>&1 || true
fi
size="$(docker image inspect -f '{{.Size}}' "$TAG")"
human="$(numfmt --to=si --suffix=B "$size" 2>/dev/null || echo "${size} bytes")"
log "done in $((SECONDS - start_s))s"
echo "image: $TAG"
echo "id:    $new_id"
echo "size:  $human ($size bytes)"
