#!/usr/bin/env bash
# Run infer-ctl's image from its unpacked bundle (scripts/build-image.sh unpack), without a container engine:
# the image's entrypoint, environment, working directory and user (from its OCI config, image-config.json beside
# the bundle's rootfs), chrooted into the bundle's rootfs in a private mount namespace, with the host's /proc,
# /dev and /tmp bound in (where the sandbox's node agent puts a Pod's kubeconfig and volumes). The network is the
# host's: the loopback API server of `infer-ctl sandbox up` is reachable. Needs root (chroot, mount).
#
#   scripts/run-image.sh [--bundle DIR] [--read-only] [--bind PATH]... [--] [ARGS...]
#
# ARGS replace the image's CMD, as a container's `args` do (none: the image's CMD). The environment passed in is
# the container's, over the image's Env, except what describes the host (PATH, HOME, PYTHONPATH, PYTHONHOME,
# VIRTUAL_ENV, LD_*, PWD, OLDPWD, SHLVL): as `docker run -e` would.
#   --bundle DIR          default ${INFER_CTL_IMAGE_CACHE:-~/.cache/infer-ctl/image}/bundle
#   --read-only           the rootfs mounted read-only (a Pod's readOnlyRootFilesystem: true)
#   --bind PATH           also bind the host's PATH at the same place (its mount point is made in the rootfs)
#
# For the sandbox's node agent, an image table entry (infer-ctl sandbox up --images FILE):
#   images:
#     - image: "ghcr.io/infer-ctl/infer-ctl*"
#       command: [/path/to/scripts/run-image.sh, --read-only, --]
# (the node agent hands the Pod's kubeconfig and volumes to the Pod's runAsUser, 65532, as kubelet does; a
# kubeconfig of your own must be readable by the image's user, 65532, e.g. a copy in a directory it can enter)
set -euo pipefail

die() { echo "run-image.sh: $*" >&2; exit 1; }

bundle=${INFER_CTL_IMAGE_CACHE:-$HOME/.cache/infer-ctl/image}/bundle
read_only=0
binds=()
while [[ $# -gt 0 ]]; do
    case $1 in
        --bundle) [[ $# -ge 2 ]] || die "--bundle: expected a directory"; bundle=$2; shift 2 ;;
        --bundle=*) bundle=${1#*=}; shift ;;
        --read-only) read_only=1; shift ;;
        --bind) [[ $# -ge 2 ]] || die "--bind: expected an absolute path"; binds+=("$2"); shift 2 ;;
        --bind=*) binds+=("${1#*=}"); shift ;;
        --) shift; break ;;
        -h|--help) sed -n '2,23p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) break ;;
    esac
done

[[ $(id -u) -eq 0 ]] || die "needs root (chroot and mount in a private mount namespace)"
rootfs=$bundle/rootfs
config=$bundle/image-config.json
[[ -d $rootfs && -f $config ]] || die "no unpacked image in $bundle (rootfs/ and image-config.json): run \
scripts/build-image.sh && scripts/build-image.sh unpack"
for path in "${binds[@]}"; do
    [[ $path == /* && -e $path ]] || die "--bind $path: expected an absolute path that exists on this machine"
done

# The image's config as NUL-separated fields: user, group, working directory, home, entrypoint length, entrypoint,
# then CMD (when no ARGS) or ARGS, then the environment (the image's, then the container's over it).
mapfile -d '' fields < <(python3 - "$config" "$rootfs" "$@" <<'EOF'
import json, os, sys
config_path, rootfs, *args = sys.argv[1:]
config = json.load(open(config_path)).get("config") or {}
user, _, group = (config.get("User") or "0").partition(":")
if not user.isdigit() or (group and not group.isdigit()):
    sys.exit(f"run-image.sh: {config_path}: User {config.get('User')!r}: expected numeric uid[:gid]")
home = "/"
for line in open(os.path.join(rootfs, "etc/passwd")):
    parts = line.rstrip("\n").split(":")
    if len(parts) >= 6 and parts[2] == user:
        group, home = group or parts[3], parts[5]
        break
entrypoint = config.get("Entrypoint") or []
command = args if args else (config.get("Cmd") or [])
if not entrypoint and not command:
    sys.exit(f"run-image.sh: {config_path}: the image has no Entrypoint and no Cmd, and no ARGS were given")
env = dict(e.partition("=")[::2] for e in config.get("Env") or [])
env.setdefault("HOME", home)
host = {"PATH", "HOME", "PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PWD", "OLDPWD", "SHLVL", "_"}
env.update({k: v for k, v in os.environ.items() if k not in host and not k.startswith("LD_")})
out = [user, group or user, config.get("WorkingDir") or "/", str(len(entrypoint)), *entrypoint, *command,
       "--env--", *(f"{k}={v}" for k, v in env.items())]
sys.stdout.write("".join(f"{field}\0" for field in out))
EOF
)
[[ ${#fields[@]} -ge 5 ]] || die "cannot read the image's config in $config"
uid=${fields[0]} gid=${fields[1]} workdir=${fields[2]}
argv=() env=()
seen_env=0
for field in "${fields[@]:4}"; do
    if [[ $seen_env -eq 0 && $field == "--env--" ]]; then seen_env=1; continue; fi
    if [[ $seen_env -eq 1 ]]; then env+=("$field"); else argv+=("$field"); fi
done

# In a private mount namespace (gone with the process): the rootfs (read-only if asked), then the host's /proc,
# /dev, /tmp and the --bind paths on top of it; then chroot as the image's user, in its working directory.
# Every step execs the next, so the node agent's signals reach the controller's own process.
mounts="set -e
mount --bind '$rootfs' '$rootfs'
if [ $read_only -eq 1 ]; then mount -o remount,bind,ro '$rootfs'; fi
mount --rbind /proc '$rootfs/proc'
mount --rbind /dev '$rootfs/dev'
mount --bind /tmp '$rootfs/tmp'"
for path in "${binds[@]}"; do
    if [[ -d $path ]]; then mkdir -p "$rootfs$path"; else mkdir -p "$(dirname "$rootfs$path")"; touch "$rootfs$path"; fi
    mounts+=$'\n'"mount --rbind '$path' '$rootfs$path'"
done
exec unshare --mount --propagation private -- /bin/sh -c "$mounts
exec chroot --userspec='$uid:$gid' --groups='' '$rootfs' /usr/bin/env -i --chdir='$workdir' \"\$@\"" \
    run-image "${env[@]}" "${argv[@]}"
