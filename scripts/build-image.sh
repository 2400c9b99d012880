#!/usr/bin/env bash
# The controller's OCI image, built without a container engine: a Debian bookworm root filesystem made by
# mmdebstrap (python3 from Debian), the project's wheel and its locked runtime dependencies installed with
# `pip install --require-hashes` (exported from uv.lock), packed by umoci into an OCI image layout in a cache
# outside the repository, tagged ghcr.io/infer-ctl/infer-ctl:<version> (the reference deploy/ uses).
#
#   scripts/build-image.sh [build]   build the image of the checkout's HEAD commit (needs root: mmdebstrap's
#                                    root mode; apt-get install -y mmdebstrap umoci)
#   scripts/build-image.sh unpack    unpack the built image into an OCI runtime bundle (rootfs/ + config.json),
#                                    what scripts/run-image.sh runs
#   scripts/build-image.sh check     build twice into two fresh layouts and compare the manifests' digests
#                                    (when they match, the first becomes the cache's image)
#   scripts/build-image.sh info      print the reference, digest and sizes of the built image
#
# Environment: INFER_CTL_IMAGE_CACHE (default ~/.cache/infer-ctl/image), INFER_CTL_IMAGE_MIRROR (default
# http://deb.debian.org/debian; a snapshot.debian.org URL pins the packages in time), UV (the uv binary).
#
# Reproducible: the image is built from the committed tree (`git archive HEAD`), SOURCE_DATE_EPOCH is the commit's
# date, mmdebstrap writes a sorted tarball with mtimes clamped to it and removes its known unreproducible files,
# pip byte-compiles with checked hashes (SOURCE_DATE_EPOCH set), and every timestamp in the image's config and
# history is that date. Two builds from the same commit and the same mirror state give the same digest; a
# security update published on the mirror in between changes it (use a snapshot mirror to pin it).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE=${INFER_CTL_IMAGE_CACHE:-$HOME/.cache/infer-ctl/image}
MIRROR=${INFER_CTL_IMAGE_MIRROR:-http://deb.debian.org/debian}
SECURITY_MIRROR=${INFER_CTL_IMAGE_SECURITY_MIRROR:-http://deb.debian.org/debian-security}
REPOSITORY=ghcr.io/infer-ctl/infer-ctl
SUITE=bookworm
IMAGE_UID=65532
LAYOUT=$CACHE/oci
BUNDLE=$CACHE/bundle

SCRATCH=
trap 'if [[ -n $SCRATCH ]]; then rm -rf "$SCRATCH"; fi' EXIT

stage() { echo "== [$(date -u +%H:%M:%S)] $*"; }

die() { echo "build-image.sh: $*" >&2; exit 1; }

version() {
    sed -n 's/^version = "\(.*\)"$/\1/p' "$ROOT/pyproject.toml" | head -n 1
}

reference() { echo "$REPOSITORY:$(version)"; }

find_uv() {
    if [[ -n ${UV:-} ]]; then echo "$UV"; return; fi
    local candidate
    for candidate in "$(command -v uv || true)" "$ROOT/.venv/bin/uv" /work/main/.venv/bin/uv; do
        if [[ -n $candidate && -x $candidate ]]; then echo "$candidate"; return; fi
    done
    die "uv not found: set UV=/path/to/uv (the dev group installs it: ./run or uv sync)"
}

preflight() {
    [[ $(id -u) -eq 0 ]] || die "needs root (mmdebstrap --mode=root makes the root filesystem with chroot)"
    local tool
    for tool in mmdebstrap umoci git tar; do
        command -v "$tool" >/dev/null || die "$tool not found (apt-get install -y mmdebstrap umoci)"
    done
    local tag
    tag=$(sed -n 's/^ *image: ghcr.io\/infer-ctl\/infer-ctl:\(.*\)$/\1/p' "$ROOT/deploy/kustomize/base/controller.yaml")
    [[ $tag == "$(version)" ]] || die "deploy/kustomize/base/controller.yaml uses tag '$tag' but pyproject.toml's \
version is '$(version)': the image would not be the one deploy/ runs"
}

# build LAYOUT COMMIT: the image of COMMIT into the OCI layout LAYOUT (created afresh), tagged $(reference)
build_into() {
    local layout=$1 commit=$2 uv scratch epoch created ref
    uv=$(find_uv)
    epoch=$(git -C "$ROOT" log -1 --format=%ct "$commit")
    created=$(date -u -d "@$epoch" +%Y-%m-%dT%H:%M:%SZ)
    ref=$(reference)
    export SOURCE_DATE_EPOCH=$epoch
    scratch=$(mktemp -d /tmp/infer-ctl-image.XXXXXX)
    SCRATCH=$scratch  # removed on exit, failed or not
    mkdir -p "$scratch/src" "$scratch/build" "$CACHE/wheels"

    stage "the committed tree at $commit (SOURCE_DATE_EPOCH=$epoch, $created)"
    git -C "$ROOT" archive --format=tar "$commit" | tar -x -C "$scratch/src"

    stage "the wheel and the locked runtime requirements (uv.lock, with hashes)"
    # the tree has no .git: setup.py records the commit it is told (`infer-ctl --version`, infer_ctl_build_info)
    (cd "$scratch/src" && INFER_CTL_BUILD_COMMIT=$commit "$uv" build --quiet --wheel --out-dir "$scratch/build/dist" .)
    (cd "$scratch/src" && "$uv" export --quiet --frozen --no-dev --no-emit-project --no-header \
        --format requirements.txt --output-file "$scratch/build/requirements.txt")
    local wheel
    wheel=$(cd "$scratch/build/dist" && ls infer_ctl-*.whl)
    echo "/tmp/build/dist/$wheel --hash=sha256:$(sha256sum "$scratch/build/dist/$wheel" | cut -d' ' -f1)" \
        > "$scratch/build/project.txt"

    local host_cert=${PIP_CERT:-${SSL_CERT_FILE:-}}
    # Run outside the chroot with the root filesystem as $1 (mmdebstrap's customize hook).
    cat > "$scratch/customize.sh" <<EOF
#!/bin/sh
set -eu
root=\$1
in_root() { chroot "\$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 \
    SOURCE_DATE_EPOCH=$epoch PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1 "\$@"; }
# the non-root user of the image (Pod Security restricted: runAsNonRoot with a numeric UID)
echo "nonroot:x:$IMAGE_UID:$IMAGE_UID:infer-ctl:/home/nonroot:/usr/sbin/nologin" >> "\$root/etc/passwd"
echo "nonroot:x:$IMAGE_UID:" >> "\$root/etc/group"
if [ -e "\$root/etc/shadow" ]; then echo "nonroot:!:$((epoch / 86400))::::::" >> "\$root/etc/shadow"; fi
install -d -o $IMAGE_UID -g $IMAGE_UID -m 0755 "\$root/home/nonroot"
# the venv, its wheels verified against uv.lock's hashes (a wheel cache kept between builds, copied in and out)
in_root python3 -m venv /opt/venv
cp -a "$scratch/build" "\$root/tmp/build"
mkdir -p "\$root/tmp/wheels"
cp -a "$CACHE/wheels/." "\$root/tmp/wheels/"
# the host's CA bundle for the download only (a TLS-inspecting proxy's CA), never in the image
cert=
if [ -n "$host_cert" ]; then cp "$host_cert" "\$root/tmp/build/host-ca.pem"; cert=--cert=/tmp/build/host-ca.pem; fi
in_root /opt/venv/bin/pip download \$cert --quiet --require-hashes --only-binary=:all: --no-deps \
    --dest /tmp/wheels -r /tmp/build/requirements.txt
cp -a "\$root/tmp/wheels/." "$CACHE/wheels/"
in_root /opt/venv/bin/pip install --quiet --no-index --find-links /tmp/wheels --require-hashes --only-binary=:all: \
    --no-deps -r /tmp/build/requirements.txt
in_root /opt/venv/bin/pip install --quiet --no-index --require-hashes --no-deps -r /tmp/build/project.txt
in_root /opt/venv/bin/pip check
# the entrypoint starts (numpy's and scipy's wheels need the system's libstdc++), writing nothing
in_root /usr/bin/env PYTHONDONTWRITEBYTECODE=1 /opt/venv/bin/infer-ctl --version
in_root /usr/bin/env PYTHONDONTWRITEBYTECODE=1 /opt/venv/bin/python -c 'import statsmodels.tsa.holtwinters, kopf'
# the installer goes: the controller needs neither pip nor setuptools at run time
in_root /opt/venv/bin/python -m pip uninstall --quiet --yes pip setuptools
rm -rf "\$root/tmp/build" "\$root/tmp/wheels" "\$root/root/.cache"
# what differs between machines (mmdebstrap copies the host's)
rm -f "\$root/etc/resolv.conf" "\$root/etc/hostname"
EOF
    chmod +x "$scratch/customize.sh"

    stage "the root filesystem (mmdebstrap $SUITE, python3) and the venv"
    # --mode=root: chroot as root; the result is a tarball (sorted names, mtimes clamped to SOURCE_DATE_EPOCH).
    # The .debs are kept in the cache between builds (apt checks them against the mirror's signed indexes; the
    # image's own apt cache is emptied by mmdebstrap's cleanup).
    mmdebstrap --quiet --mode=root --variant=essential --format=tar \
        --include=python3,python3-venv,libstdc++6,ca-certificates,tzdata \
        --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/info/*' \
        --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
        --dpkgopt='path-exclude=/usr/share/locale/*' \
        --skip=essential/unlink \
        --setup-hook="mkdir -p '$CACHE/debs' \"\$1\"/var/cache/apt/archives" \
        --setup-hook="sync-in '$CACHE/debs' /var/cache/apt/archives/" \
        --customize-hook="sync-out /var/cache/apt/archives '$CACHE/debs'" \
        --customize-hook="$scratch/customize.sh \"\$1\"" \
        "$SUITE" "$scratch/rootfs.tar" \
        "deb $MIRROR $SUITE main" "deb $MIRROR $SUITE-updates main" "deb $SECURITY_MIRROR $SUITE-security main"

    stage "the OCI image $ref"
    rm -rf "$layout"
    mkdir -p "$(dirname "$layout")"
    umoci init --layout "$layout"
    umoci new --image "$layout:$ref"
    umoci raw add-layer --image "$layout:$ref" --history.created="$created" \
        --history.created_by="scripts/build-image.sh: mmdebstrap $SUITE, python3, /opt/venv from uv.lock" \
        "$scratch/rootfs.tar"
    umoci config --image "$layout:$ref" --created="$created" --history.created="$created" \
        --history.created_by="scripts/build-image.sh: entrypoint, user and labels" \
        --architecture=amd64 --os=linux \
        --config.user="$IMAGE_UID:$IMAGE_UID" --config.workingdir=/home/nonroot \
        --config.entrypoint=/opt/venv/bin/infer-ctl --config.cmd=controller --config.cmd=--help \
        --config.env=PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
        --config.env=LANG=C.UTF-8 --config.env=PYTHONUNBUFFERED=1 \
        --config.label=org.opencontainers.image.title=infer-ctl \
        --config.label=org.opencontainers.image.version="$(version)" \
        --config.label=org.opencontainers.image.revision="$commit" \
        --config.label=org.opencontainers.image.created="$created" \
        --config.label=org.opencontainers.image.licenses=Apache-2.0 \
        --config.label=org.opencontainers.image.source=https://github.com/infer-ctl/infer-ctl \
        --config.label=org.opencontainers.image.base.name="debian:$SUITE" \
        --manifest.annotation=org.opencontainers.image.revision="$commit"
    umoci gc --layout "$layout"
    rm -rf "$scratch"
}

# The manifest's digest of $(reference) in LAYOUT.
digest_of() {
    python3 - "$1" "$(reference)" <<'EOF'
import json, sys
index = json.load(open(f"{sys.argv[1]}/index.json"))
print(next(m["digest"] for m in index["manifests"]
           if m.get("annotations", {}).get("org.opencontainers.image.ref.name") == sys.argv[2]))
EOF
}

info() {
    [[ -f $LAYOUT/index.json ]] || die "no image in $LAYOUT: run scripts/build-image.sh first"
    python3 - "$LAYOUT" "$(reference)" <<'EOF'
import json, sys
layout, ref = sys.argv[1:]
index = json.load(open(f"{layout}/index.json"))
desc = next(m for m in index["manifests"] if m.get("annotations", {}).get("org.opencontainers.image.ref.name") == ref)
blob = lambda d: f"{layout}/blobs/{d.partition(':')[0]}/{d.partition(':')[2]}"
manifest = json.load(open(blob(desc["digest"])))
config = json.load(open(blob(manifest["config"]["digest"])))
layers = sum(layer["size"] for layer in manifest["layers"])
print(f"reference:  {ref}")
print(f"layout:     {layout}")
print(f"digest:     {desc['digest']}")
print(f"layers:     {len(manifest['layers'])}, {layers} bytes compressed ({layers / 2**20:.1f} MiB)")
print(f"created:    {config.get('created')}")
print(f"user:       {config['config'].get('User')}")
print(f"entrypoint: {config['config'].get('Entrypoint')} cmd {config['config'].get('Cmd')}")
print(f"revision:   {config['config'].get('Labels', {}).get('org.opencontainers.image.revision')}")
EOF
}

unpack() {
    [[ -f $LAYOUT/index.json ]] || die "no image in $LAYOUT: run scripts/build-image.sh first"
    rm -rf "$BUNDLE"
    umoci unpack --image "$LAYOUT:$(reference)" "$BUNDLE" >/dev/null
    # the image's own config (Entrypoint and Cmd apart, Env, User, WorkingDir, Labels) for scripts/run-image.sh
    python3 - "$LAYOUT" "$(digest_of "$LAYOUT")" > "$BUNDLE/image-config.json" <<'EOF'
import json, sys
layout, digest = sys.argv[1:]
blob = lambda d: f"{layout}/blobs/{d.replace(':', '/')}"
manifest = json.load(open(blob(digest)))
sys.stdout.write(open(blob(manifest["config"]["digest"])).read())
EOF
    echo "unpacked $(reference) ($(digest_of "$LAYOUT")) into $BUNDLE: $(du -sb "$BUNDLE/rootfs" | cut -f1) bytes"
    echo "run it: scripts/run-image.sh --bundle $BUNDLE -- --version"
}

head_commit() {
    if [[ -n $(git -C "$ROOT" status --porcelain --untracked-files=no) ]]; then
        echo "build-image.sh: note: uncommitted changes are not in the image (it is built from HEAD)" >&2
    fi
    git -C "$ROOT" rev-parse HEAD
}

check() {
    local a=$CACHE/check-a b=$CACHE/check-b da db commit started
    commit=$(head_commit)
    started=$SECONDS
    build_into "$a" "$commit"
    echo "first build in $((SECONDS - started)) s"
    started=$SECONDS
    build_into "$b" "$commit"
    echo "second build in $((SECONDS - started)) s"
    da=$(digest_of "$a")
    db=$(digest_of "$b")
    if [[ $da == "$db" ]]; then
        echo "reproducible: both builds are $da"
        # the first build becomes the cache's image (what `unpack` and the tests read)
        rm -rf "$b" "$LAYOUT"
        mv "$a" "$LAYOUT"
        info
        return 0
    fi
    echo "NOT reproducible: $da != $db; what differs:"
    python3 - "$a" "$b" "$(reference)" <<'EOF'
import gzip, hashlib, json, sys, tarfile
def image(layout, ref):
    index = json.load(open(f"{layout}/index.json"))
    blob = lambda d: f"{layout}/blobs/{d.replace(':', '/')}"
    desc = next(m for m in index["manifests"] if m.get("annotations", {}).get("org.opencontainers.image.ref.name") == ref)
    manifest = json.load(open(blob(desc["digest"])))
    config = json.load(open(blob(manifest["config"]["digest"])))
    files = {}
    for layer in manifest["layers"]:
        with tarfile.open(blob(layer["digest"]), "r|gz") as tar:
            for m in tar:
                data = tar.extractfile(m).read() if m.isfile() else b""
                files[m.name] = (m.mode, m.uid, m.gid, m.mtime, m.linkname, hashlib.sha256(data).hexdigest())
    return config, files
(ca, fa), (cb, fb) = image(sys.argv[1], sys.argv[3]), image(sys.argv[2], sys.argv[3])
if ca != cb:
    print("  the configs differ:", {k for k in ca.keys() | cb.keys() if ca.get(k) != cb.get(k)})
for name in sorted(fa.keys() | fb.keys()):
    if fa.get(name) != fb.get(name):
        print(f"  {name}: {fa.get(name)} != {fb.get(name)}")
EOF
    echo "(layouts kept in $a and $b)"
    return 1
}

main() {
    local action=${1:-build}
    case $action in
        build)
            preflight
            local started=$SECONDS
            build_into "$LAYOUT.new" "$(head_commit)"
            rm -rf "$LAYOUT"
            mv "$LAYOUT.new" "$LAYOUT"
            echo "built in $((SECONDS - started)) s"
            info
            ;;
        unpack) unpack ;;
        check) preflight; check ;;
        info) info ;;
        -h|--help|help) sed -n '2,/^set /p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' ;;
        *) die "unknown action '$action' (build, unpack, check, info)" ;;
    esac
}

main "$@"
