#!/usr/bin/env bash
# Builds images/Dockerfile.cpu (and, on request, Dockerfile.cuda) for real and runs one pipeline
# component in each result the way KFP's launcher does (images/smoke_component.py), as the
# image's non-root user. Slow (a base system, torch and the project are installed from scratch):
# `make images-check` runs it; `make test` and CI (.ci/run) do not.
#
# No Docker engine is needed: buildah builds the Dockerfile (vfs storage, chroot isolation, so it
# also works inside an unprivileged container) and runs commands in the image. The upstream base
# (python:3.11.x-slim-bookworm) may not be pullable, so the build uses BASE_IMAGE = a local base
# made with debootstrap: Debian bookworm and its python3.11 (the upstream base's Debian release
# and Python minor version), in a venv first on PATH, as the upstream image's /usr/local Python.
#
# Needs root, buildah and debootstrap (Debian: apt-get install -y buildah debootstrap), Debian's
# package mirror and PyPI. Settings (environment):
#   FLAVOURS    the images to build and run: cpu (default), cuda, or "cpu cuda".
#   CPU_TORCH   where the CPU image's torch comes from:
#               index     the Dockerfile's own source, the CPU-only wheels of
#                         https://download.pytorch.org/whl/cpu (2.14.1+cpu), checked to be +cpu;
#               pypi-cuda a stand-in where that index cannot be reached: PyPI's torch wheel (the
#                         CUDA 13.0 build), with the build's check told to expect +cu130; every
#                         other step is the same, and the summary says so;
#               auto      (default) index when it answers, else pypi-cuda.
#   IMAGES_CHECK_DIR  buildah's storage, the base's root filesystem and scratch space
#                     (default /var/tmp/batchscale-images-check; vfs copies every layer whole,
#                     so ~15 GB free while an image is built; the base is kept and reused).
#   DEBIAN_MIRROR     for debootstrap (default http://deb.debian.org/debian).
#   CA_BUNDLE         the host's CA bundle, copied into the local base for pip (default
#                     /etc/ssl/certs/ca-certificates.crt; must hold a TLS-inspecting proxy's CA).
#   KEEP=1            keep the built images (localhost/batchscale-<flavour>:check) for a look.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CHECK_DIR=${IMAGES_CHECK_DIR:-/var/tmp/batchscale-images-check}
DEBIAN_MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
CA_BUNDLE=${CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}
FLAVOURS=${FLAVOURS:-cpu}
CPU_TORCH=${CPU_TORCH:-auto}
CPU_INDEX_URL=https://download.pytorch.org/whl/cpu
# The upstream base's Debian release and Python minor version (Dockerfile's BASE_IMAGE default).
DEBIAN_SUITE=bookworm
PYTHON_MINOR=3.11
BASE_NAME=localhost/batchscale-check-base:${DEBIAN_SUITE}-python${PYTHON_MINOR}
VENV=/opt/python${PYTHON_MINOR}
CONTAINERS=()
IMAGES=()
TIMES=()
NOTES=()

say() { printf 'images-check: %s\n' "$*"; }
die() { printf 'images-check: FAILED: %s\n' "$*" >&2; exit 1; }
bah() { buildah --root "$CHECK_DIR/storage" --runroot "$CHECK_DIR/run" --storage-driver vfs "$@"; }
image_tag() { printf 'localhost/batchscale-%s:check' "$1"; }

cleanup() {
    local item
    for item in "${CONTAINERS[@]}"; do bah rm "$item" >/dev/null 2>&1 || true; done
    if [[ ${KEEP:-0} != 1 ]]; then
        for item in "${IMAGES[@]}"; do bah rmi "$item" >/dev/null 2>&1 || true; done
    fi
}

# Settings first (they need nothing), then what the machine must have.
preflight() {
    local tool flavour missing=()
    case $CPU_TORCH in auto|index|pypi-cuda) ;;
        *) die "CPU_TORCH=$CPU_TORCH; allowed: auto, index, pypi-cuda" ;; esac
    [[ -n ${FLAVOURS// /} ]] || die "FLAVOURS is empty; allowed: cpu, cuda, \"cpu cuda\""
    for flavour in $FLAVOURS; do
        case $flavour in cpu|cuda) ;;
            *) die "FLAVOURS names '$flavour'; allowed: cpu, cuda, \"cpu cuda\"" ;; esac
    done
    [[ $(id -u) == 0 ]] || die "run as root: debootstrap and buildah's chroot isolation need it"
    for tool in buildah debootstrap python3; do
        command -v "$tool" >/dev/null || missing+=("$tool")
    done
    ((${#missing[@]} == 0)) ||
        die "missing ${missing[*]}; on Debian: apt-get install -y ${missing[*]}"
    mkdir -p "$CHECK_DIR"
}

index_answers() {
    python3 -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=15)' \
        "$CPU_INDEX_URL/torch/" >/dev/null 2>&1
}

# --build-arg flags, in TORCH_ARGS, for the CPU image's torch source that CPU_TORCH picks.
cpu_torch_args() {
    local source=$CPU_TORCH
    if [[ $source == auto ]]; then
        if index_answers; then source=index; else source=pypi-cuda; fi
    fi
    if [[ $source == index ]]; then
        NOTES+=("cpu torch: the CPU-only wheel from $CPU_INDEX_URL, checked +cpu by the build")
        TORCH_ARGS=()
    else
        local note="cpu torch: STAND-IN, PyPI's CUDA 13.0 wheel instead of the CPU-only one"
        NOTES+=("$note from $CPU_INDEX_URL (CPU_TORCH=$CPU_TORCH): the check expected +cu130")
        TORCH_ARGS=(--build-arg TORCH_INDEX_URL=https://pypi.org/simple
                    --build-arg TORCH_VARIANT=cu130)
    fi
}

# The base's tag ends in a hash of its recipe (build_base) and the CA bundle, so a changed
# recipe builds a new base instead of reusing a stale one.
base_tag() {
    local recipe
    recipe=$( { declare -f build_base; cat "$CA_BUNDLE" 2>/dev/null || true; } | sha256sum)
    BASE_TAG=$BASE_NAME-${recipe:0:12}
}

# Debian bookworm + python3.11 in a venv on PATH, imported as $BASE_TAG; reused when present.
build_base() {
    if bah inspect --type image "$BASE_TAG" >/dev/null 2>&1; then
        say "base $BASE_TAG already built, reused"
        return
    fi
    local rootfs=$CHECK_DIR/rootfs tarball=$CHECK_DIR/rootfs.tar ctr
    rm -rf "$rootfs" "$tarball"
    # python3-distutils by name: it provides the virtual python3.11-distutils that
    # python3.11-venv depends on, and debootstrap's resolver does not follow virtual packages.
    local packages="python${PYTHON_MINOR},python${PYTHON_MINOR}-venv,python3-distutils"
    debootstrap --variant=minbase --include="$packages,ca-certificates" \
        "$DEBIAN_SUITE" "$rootfs" "$DEBIAN_MIRROR"
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
    # Trust what this machine trusts, so that the build's pip also works where HTTPS passes a
    # TLS-inspecting proxy whose CA only the host knows (pip ignores the system store unless
    # PIP_CERT names it).
    if [[ -f $CA_BUNDLE ]]; then cp "$CA_BUNDLE" "$rootfs/etc/ssl/certs/ca-certificates.crt"; fi
    # buildah mounts /dev, /proc and /sys itself when it runs a command.
    tar -C "$rootfs" --numeric-owner --exclude='./dev/*' --exclude='./proc/*' \
        --exclude='./sys/*' -cf "$tarball" .
    ctr=$(bah from scratch)
    CONTAINERS+=("$ctr")
    bah add "$ctr" "$tarball" /
    bah run --isolation chroot "$ctr" -- "python${PYTHON_MINOR}" -m venv "$VENV"
    bah config --env "PATH=$VENV/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
        --env LANG=C.UTF-8 --env PIP_CERT=/etc/ssl/certs/ca-certificates.crt \
        --cmd python3 "$ctr"
    bah commit --rm "$ctr" "$BASE_TAG"
    CONTAINERS=()
    rm -rf "$rootfs" "$tarball"
    new_container "$BASE_TAG"
    say "base $BASE_TAG: $(bah run --isolation chroot "$CTR" -- python3 --version)"
}

# A working container of image $1, in CTR (removed on exit).
new_container() {
    CTR=$(bah from --pull=never "$1")
    CONTAINERS+=("$CTR")
}

build_image() {
    local flavour=$1 commit args=()
    commit=$(git -C "$ROOT" rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
    if [[ $flavour == cpu ]]; then args=("${TORCH_ARGS[@]}"); fi
    IMAGES+=("$(image_tag "$flavour")")
    bah bud --isolation chroot --pull=never --layers=false \
        -f "$ROOT/images/Dockerfile.$flavour" \
        --ignorefile "$ROOT/images/Dockerfile.$flavour.dockerignore" \
        --build-arg "BASE_IMAGE=$BASE_TAG" --build-arg "BATCHSCALE_GIT_COMMIT=$commit" \
        "${args[@]}" -t "$(image_tag "$flavour")" "$ROOT"
}

# data_prep through kfp.dsl.executor_main, as the image's USER (buildah run uses it); then the
# image goes (vfs keeps whole copies) unless KEEP=1.
smoke() {
    local image user
    image=$(image_tag "$1")
    user=$(bah inspect --type image --format '{{.OCIv1.Config.User}}' "$image")
    [[ -n $user && ${user%%:*} != 0 && ${user%%:*} != root ]] || die "image USER is '$user'"
    new_container "$image"
    bah copy "$CTR" "$ROOT/images/smoke_component.py" /tmp/smoke_component.py
    say "running data_prep in $image as USER $user"
    bah run --isolation chroot "$CTR" -- python3 /tmp/smoke_component.py data_prep
    cleanup
    CONTAINERS=()
}

timed() {
    local name=$1 start=$SECONDS
    shift
    say "--- $name"
    "$@"
    TIMES+=("$name $((SECONDS - start)) s")
}

main() {
    trap cleanup EXIT
    preflight
    local flavour
    if [[ " $FLAVOURS " == *" cpu "* ]]; then cpu_torch_args; fi
    base_tag
    timed base build_base
    for flavour in $FLAVOURS; do
        timed "build $flavour" build_image "$flavour"
        timed "smoke $flavour" smoke "$flavour"
    done
    local times note
    times=$(printf '%s, ' "${TIMES[@]}")
    say "PASSED in $SECONDS s (${times%, })"
    for note in "${NOTES[@]}"; do say "$note"; done
}

main "$@"
