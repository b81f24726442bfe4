#!/usr/bin/env bash
# build-sandbox-image.sh: build the local Docker image that computerd's Docker provider runs
# bots' computers in, without any registry.
#
# Why: this machine cannot reach a registry, so `docker pull` and `FROM debian` are impossible.
# Instead the image is assembled from the HOST's own installed Debian (bookworm) packages:
#
#   1. every file and symlink that `dpkg -L` lists for a fixed set of packages (bash, coreutils,
#      procps, dash, grep, sed, tar, gzip, findutils, python3.11 with its stdlib, ...) is copied
#      into a temporary staging rootfs, minus docs, man pages, locales and other dead weight,
#      plus the host's compiled stdlib bytecode (__pycache__) for the copied Python sources;
#   2. the shared libraries of every ELF file in it (and of computer-agent) are resolved with
#      `ldd` and copied too, keeping symlink chains, the dynamic loader
#      (/lib64/ld-linux-x86-64.so.2) and the host's merged-/usr layout (/bin -> usr/bin, ...);
#   3. a minimal /etc (root and `user` uid 1000, nsswitch, hosts, ld.so.cache, CA bundle, ...),
#      /tmp, /root, /home/user, /workspace (user's: sessions' working directory), the agent's
#      root-only /var/lib/computer-agent and the /proc /sys /dev mount points are
#      added, and the agent is installed as /usr/local/bin/computer-agent;
#   4. the tree is streamed into `docker import` with PATH/HOME/WORKDIR/CMD set.
#
# Usage: deploy/build-sandbox-image.sh [--agent PATH] [--tag TAG]
#   --agent PATH  computer-agent binary (default: <repo>/target/release/computer-agent if it
#                 exists, else <repo>/target/debug/computer-agent; it is never built here)
#   --tag TAG     image tag (default: computerd-sandbox:latest)
#
# Must run as root on a Debian bookworm host with Docker. Idempotent: re-running re-tags and
# drops the previous image if nothing else uses it. Takes a few seconds.
set -euo pipefail
shopt -s nullglob

SCRIPT_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd -P)"
REPO_ROOT="$(cd -- "$SCRIPT_DIR/.." && pwd -P)"

die() { echo "build-sandbox-image: error: $*" >&2; exit 1; }
warn() { echo "build-sandbox-image: warning: $*" >&2; }
log() { echo "build-sandbox-image: $*" >&2; }

usage() { sed -n '20,24s/^# \{0,1\}//p' "${BASH_SOURCE[0]}"; }

AGENT=""
TAG="computerd-sandbox:latest"
while (($#)); do
    case "$1" in
        --agent) (($# >= 2)) || die "--agent needs a PATH"; AGENT="$2"; shift 2 ;;
        --agent=*) AGENT="${1#--agent=}"; shift ;;
        --tag) (($# >= 2)) || die "--tag needs a TAG"; TAG="$2"; shift 2 ;;
        --tag=*) TAG="${1#--tag=}"; shift ;;
        -h|--help) usage; exit 0 ;;
        *) usage >&2; die "unknown argument: $1" ;;
    esac
done
[[ -n "$TAG" ]] || die "--tag must not be empty"

# ---- preconditions -------------------------------------------------------------------------

[[ $EUID -eq 0 ]] || die "must run as root (reads every package file and sets ownership in the image)"
command -v docker >/dev/null 2>&1 || die "docker is not installed (no 'docker' command on PATH)"
docker info >/dev/null 2>&1 || die "cannot talk to the Docker daemon ('docker info' failed); is dockerd running?"
for tool in dpkg-query ldd ldconfig tar chroot; do
    command -v "$tool" >/dev/null 2>&1 || die "'$tool' not found; this script needs a Debian host"
done
[[ "$(uname -m)" == x86_64 ]] || warn "written for x86_64, this host is $(uname -m)"

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

# Packages whose files go into the image. REQUIRED ones must be installed on the host;
# OPTIONAL ones are taken when present. Libraries that only some ELF file needs (libssl3,
# libsqlite3-0, libffi8, ...) are picked up by the ldd pass anyway.
REQUIRED_PKGS=(
    bash coreutils procps libproc2-0 dash grep sed tar gzip findutils libc-bin
    python3.11-minimal libpython3.11-minimal libpython3.11-stdlib python3.11
    python3-minimal python3
)
OPTIONAL_PKGS=(
    base-files     # /etc/os-release, /etc/debian_version, the stock /etc/profile and dotfiles
    debianutils    # which, run-parts
    hostname
    mawk           # awk
    ncurses-base   # terminfo, so `top` and `clear` work with TERM=xterm
    ncurses-bin    # clear, tput, reset
    netbase        # /etc/services, /etc/protocols (socket.getservbyname, ...)
    libssl3        # OpenSSL providers/engines (libssl itself also comes via ldd of _ssl)
    openssl        # /usr/lib/ssl -> /etc/ssl links, openssl.cnf, the openssl CLI
    tzdata         # /usr/share/zoneinfo for zoneinfo/time zones
)

pkg_installed() {
    [[ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null)" == "install ok installed" ]]
}

PKGS=()
missing=()
for p in "${REQUIRED_PKGS[@]}"; do
    if pkg_installed "$p"; then PKGS+=("$p"); else missing+=("$p"); fi
done
((${#missing[@]} == 0)) || die "required Debian packages not installed on this host: ${missing[*]}" \
    "(this script copies them from the host; on bookworm: apt-get install ${missing[*]})"
for p in "${OPTIONAL_PKGS[@]}"; do
    if pkg_installed "$p"; then PKGS+=("$p"); else warn "optional package $p not installed, skipped"; fi
done

# ---- staging ---------------------------------------------------------------------------------

STAGE="$(mktemp -d "${TMPDIR:-/tmp}/computerd-sandbox.XXXXXX")"
trap 'rm -rf -- "$STAGE"' EXIT
ROOTFS="$STAGE/rootfs"
mkdir -m 0755 "$ROOTFS"
start_s=$SECONDS

# Merged-/usr: mirror the host's top-level symlinks (/bin -> usr/bin, /lib64 -> usr/lib64, ...)
# and rewrite paths through them so each file is copied exactly once, at its real place.
declare -A MERGED=()   # "bin" -> "usr/bin"
for d in bin sbin lib lib32 lib64 libx32; do
    if [[ -L "/$d" ]]; then
        t="$(readlink "/$d")"
        t="${t#/}"
        MERGED[$d]="$t"
        mkdir -p "$ROOTFS/$t"
        ln -s "$t" "$ROOTFS/$d"
    fi
done

# canon PATH -> relative path (no leading /) with merged-/usr prefixes rewritten.
canon() {
    local p="${1#/}" top="${1#/}"
    top="${top%%/*}"
    if [[ -n "${MERGED[$top]:-}" && "$p" == "$top"/* ]]; then
        p="${MERGED[$top]}/${p#"$top"/}"
    fi
    REPLY="$p"
}

declare -A SEEN=()
LIST="$STAGE/files.list"
: >"$LIST"
add() {   # add host PATH (absolute) to the copy list, once
    canon "$1"
    local rel="$REPLY"
    [[ -z "$rel" || -n "${SEEN[$rel]:-}" ]] && return 0
    [[ -e "/$rel" || -L "/$rel" ]] || return 0
    SEEN[$rel]=1
    printf '%s\0' "$rel" >>"$LIST"
}

# add PATH and, if it is a symlink, every link in its chain down to the real file.
add_chain() {
    local p="$1" t i
    for ((i = 0; i < 40; i++)); do
        add "$p"
        [[ -L "$p" ]] || return 0
        t="$(readlink "$p")"
        [[ "$t" == /* ]] || t="$(dirname -- "$p")/$t"
        p="$t"
    done
}

skip_path() {
    case "$1" in
        /.|/usr/share/doc|/usr/share/doc/*|/usr/share/doc-base|/usr/share/doc-base/*) return 0 ;;
        /usr/share/man|/usr/share/man/*|/usr/share/info|/usr/share/info/*) return 0 ;;
        /usr/share/locale|/usr/share/locale/*|/usr/share/lintian|/usr/share/lintian/*) return 0 ;;
        /usr/share/bug|/usr/share/bug/*|/usr/share/menu|/usr/share/menu/*) return 0 ;;
        /usr/share/pixmaps|/usr/share/pixmaps/*|/usr/share/applications|/usr/share/applications/*) return 0 ;;
        /usr/share/binfmts|/usr/share/binfmts/*|/usr/lib/binfmt.d|/usr/lib/binfmt.d/*) return 0 ;;
        /usr/share/common-licenses|/usr/share/common-licenses/*|/usr/lib/valgrind|/usr/lib/valgrind/*) return 0 ;;
        /boot|/usr/games|/usr/include|/usr/share/dict) return 0 ;;
    esac
    # the merged-/usr symlinks themselves are created above
    local top="${1#/}"
    [[ "$top" != */* && -n "${MERGED[$top]:-}" ]] && return 0
    return 1
}

PKG_LIST="$STAGE/pkg-files.txt"
dpkg-query -L "${PKGS[@]}" >"$PKG_LIST"
npy=0
while IFS= read -r f; do
    [[ -n "$f" && "$f" == /* ]] || continue   # dpkg -L also prints "diverted by" notes
    skip_path "$f" && continue
    add "$f"
    # Debian compiles the stdlib at install time; the .pyc files are not in `dpkg -L`.
    if [[ "$f" == /usr/lib/python3*/*.py || "$f" == /usr/share/python3/*.py ]]; then
        dir="${f%/*}" base="${f##*/}"
        for pyc in "$dir/__pycache__/${base%.py}".cpython-*.pyc; do
            [[ "$pyc" == *.opt-*.pyc ]] && continue
            add "$pyc"; npy=$((npy + 1))
        done
    fi
done <"$PKG_LIST"

# Generated by maintainer scripts (not in dpkg -L) or owned by packages left out on purpose.
for f in /etc/ld.so.conf /etc/ld.so.conf.d/libc.conf /etc/ld.so.conf.d/x86_64-linux-gnu.conf \
         /etc/ssl/certs/ca-certificates.crt /etc/ssl/openssl.cnf; do
    add "$f"
done

log "copying $(tr -cd '\0' <"$LIST" | wc -c) paths from ${#PKGS[@]} packages ($npy .pyc)"
tar -C / --no-recursion --null -T "$LIST" -cf - | tar -C "$ROOTFS" -xpf -

# Alternatives (/usr/bin/which -> /etc/alternatives/which -> which.debianutils, awk, rmt, ...)
# are made by maintainer scripts. Recreate the master links whose chosen target was copied.
nalt=0
while read -r name _mode value; do
    canon "$value"
    [[ -e "$ROOTFS/$REPLY" && -r "/var/lib/dpkg/alternatives/$name" ]] || continue
    link="$(sed -n 2p "/var/lib/dpkg/alternatives/$name")"
    [[ "$link" == /* ]] || continue
    canon "$link"
    [[ -e "$ROOTFS/$REPLY" || -L "$ROOTFS/$REPLY" ]] && continue
    mkdir -p "$ROOTFS/etc/alternatives" "$(dirname -- "$ROOTFS/$REPLY")"
    ln -sfn "$value" "$ROOTFS/etc/alternatives/$name"
    ln -sfn "/etc/alternatives/$name" "$ROOTFS/$REPLY"
    nalt=$((nalt + 1))
done < <(update-alternatives --get-selections 2>/dev/null || true)
log "recreated $nalt alternatives"

# ---- shared libraries ------------------------------------------------------------------------

mkdir -p "$ROOTFS/usr/local/bin"
install -m 0755 "$AGENT" "$ROOTFS/usr/local/bin/computer-agent"

LIBS="$STAGE/libs.txt"
LDD_OUT="$STAGE/ldd.txt"
# Every executable or shared object; ldd says "not a dynamic executable" for the rest.
(cd "$ROOTFS" && find . -xdev -type f \( -perm /111 -o -name '*.so' -o -name '*.so.*' \) -print0) |
    (cd "$ROOTFS" && xargs -0 -r ldd) >"$LDD_OUT" 2>/dev/null || true
if grep -q 'not found' "$LDD_OUT"; then
    awk '/^[^\t]/ { hdr = $0 } /not found/ { print hdr; print }' "$LDD_OUT" >&2
    die "some shared libraries could not be resolved on the host (see above)"
fi
awk '/^\t/ { if ($2 == "=>" && $3 ~ /^\//) print $3; else if ($1 ~ /^\//) print $1 }' "$LDD_OUT" |
    sort -u >"$LIBS"
nlibs=0
: >"$LIST"
while IFS= read -r lib; do
    add_chain "$lib"
    nlibs=$((nlibs + 1))
done <"$LIBS"
if [[ -s "$LIST" ]]; then
    tar -C / --no-recursion --null -T "$LIST" -cf - | tar -C "$ROOTFS" -xpf -
fi
log "resolved $nlibs shared libraries"
[[ -e "$ROOTFS/lib64/ld-linux-x86-64.so.2" ]] || die "dynamic loader missing from the image"

# ---- /etc, users, directories ----------------------------------------------------------------

R="$ROOTFS"
mkdir -p "$R/etc" "$R/root" "$R/home/user" "$R/workspace" "$R/var/lib/computer-agent" "$R/var/tmp" \
         "$R/var/log" "$R/tmp" "$R/run" "$R/proc" "$R/sys" "$R/dev" "$R/usr/local/sbin" \
         "$R/usr/local/lib" "$R/usr/local/share" "$R/etc/ssl/certs"
chmod 0755 "$R/etc" "$R/home" "$R/var" "$R/var/lib" "$R/var/lib/computer-agent" "$R/run" \
           "$R/usr/local" "$R/usr/local/bin" "$R/proc" "$R/sys" "$R/dev"
mkdir -p "$R/run/lock"   # /var/lock -> /run/lock
chmod 1777 "$R/tmp" "$R/var/tmp" "$R/run/lock"
chmod 0700 "$R/root"

cat >"$R/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/bin/bash
user:x:1000:1000:user:/home/user:/bin/bash
nobody:x:65534:65534:nobody:/nonexistent:/bin/false
EOF
cat >"$R/etc/group" <<'EOF'
root:x:0:
tty:x:5:
users:x:100:user
user:x:1000:
nogroup:x:65534:
EOF
cat >"$R/etc/shadow" <<'EOF'
root:*:19000:0:99999:7:::
user:*:19000:0:99999:7:::
nobody:*:19000:0:99999:7:::
EOF
chmod 0644 "$R/etc/passwd" "$R/etc/group"
chmod 0640 "$R/etc/shadow"
cat >"$R/etc/nsswitch.conf" <<'EOF'
passwd:         files
group:          files
shadow:         files
hosts:          files dns
networks:       files
protocols:      files
services:       files
ethers:         files
rpc:            files
EOF
# Docker bind-mounts its own /etc/hosts, /etc/hostname and /etc/resolv.conf over these.
cat >"$R/etc/hosts" <<'EOF'
127.0.0.1	localhost
::1	localhost ip6-localhost ip6-loopback
EOF
echo sandbox >"$R/etc/hostname"
: >"$R/etc/resolv.conf"
ln -sfn ../proc/self/mounts "$R/etc/mtab"
[[ -e "$R/etc/os-release" || ! -e "$R/usr/lib/os-release" ]] || ln -s ../usr/lib/os-release "$R/etc/os-release"
if [[ -e "$R/usr/share/zoneinfo/Etc/UTC" ]]; then
    ln -sfn /usr/share/zoneinfo/Etc/UTC "$R/etc/localtime"
    echo Etc/UTC >"$R/etc/timezone"
fi
# base-files installs /etc/profile and root's dotfiles from these templates in its postinst.
bf="$R/usr/share/base-files"
[[ -e "$R/etc/profile" || ! -f "$bf/profile" ]] || install -m 0644 "$bf/profile" "$R/etc/profile"
[[ -f "$bf/dot.bashrc" ]] && install -m 0644 "$bf/dot.bashrc" "$R/root/.bashrc"
[[ -f "$bf/dot.profile" ]] && install -m 0644 "$bf/dot.profile" "$R/root/.profile"
for f in "$R"/etc/skel/.[!.]*; do install -m 0644 "$f" "$R/home/user/${f##*/}"; done
chown -R 1000:1000 "$R/home/user" "$R/workspace"
chmod 0755 "$R/home/user" "$R/workspace"
# The agent's state (credential, tool runtime) is root's; the agent narrows it further at start.
chmod 0700 "$R/var/lib/computer-agent"

# ld.so.cache for the image's own library set (-X: leave the copied symlinks alone).
ldconfig -X -r "$R"

# ---- sanity check in a chroot, before handing it to docker -----------------------------------

chroot "$R" /bin/sh -c 'bash -c "echo -n" && sleep 0 && env true && grep -q root /etc/passwd' \
    || die "smoke test in the staged rootfs failed (sh/bash/sleep/env/grep)"
chroot "$R" /usr/bin/python3 -c 'import json, os, subprocess, ssl, sqlite3, decimal, zlib, hashlib' \
    || die "smoke test in the staged rootfs failed (python3 stdlib imports)"
# Links into packages left out (e.g. /etc/rmt when no rmt alternative was copied) are dropped.
dangling="$(chroot "$R" /usr/bin/find / -xdev -xtype l ! -path /etc/mtab -print -delete 2>/dev/null || true)"
[[ -z "$dangling" ]] || log "removed dangling symlinks: $(echo $dangling)"

# ---- import ----------------------------------------------------------------------------------

old_id="$(docker image inspect -f '{{.Id}}' "$TAG" 2>/dev/null || true)"
log "importing $(du -sh "$R" | cut -f1) rootfs as $TAG"
new_id="$(tar -C "$R" --numeric-owner -cf - . | docker import \
    --change 'ENV PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin' \
    --change 'ENV HOME=/root' \
    --change 'WORKDIR /root' \
    --change 'CMD ["/usr/local/bin/computer-agent"]' \
    --message "computerd sandbox: host $(. /etc/os-release && echo "$PRETTY_NAME") packages + $(basename -- "$AGENT")" \
    - "$TAG")"
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
