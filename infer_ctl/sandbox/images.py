"""The image table: which local command the node agent runs for a container image (there is no container runtime).

A YAML file `images: [{image: "<fnmatch glob on the image reference>", command: [argv...]}]`; the entries of the
user's file (`infer-ctl sandbox up --images FILE`) come before the built-in ones, and the first match wins. The
built-in entries map the engines' published images to the sandbox's stand-ins, which speak the engine's interface:
`vllm/vllm-openai*` to `python -m infer_ctl.sandbox.modelserver vllm`, `lmsysorg/sglang*` to `... sglang`.

A container's own `command` stands for the engine's launcher (the image's ENTRYPOINT when absent): for a built-in
entry the agent accepts the launchers that image really has (`vllm serve`, `python3 -m
vllm.entrypoints.openai.api_server`; `python3 -m sglang.launch_server`) and strips them, passing `args` only; any
other command is refused, since the stand-in could not honour it. A user's entry runs `command + args` as given.
"""

from __future__ import annotations

import fnmatch
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

STANDIN_MODULE = "infer_ctl.sandbox.modelserver"
_PYTHONS = ("python", "python3")


class ImageTableError(ValueError):
    """A bad image table; the message names the file, the entry and the field."""


@dataclass(frozen=True, slots=True)
class ImageEntry:
    image: str  # fnmatch glob on the container's image reference
    command: tuple[str, ...]
    # The launchers the image's container may name in `command` (stripped: the entry's command replaces them);
    # None: any container command is appended to the entry's (a user's entry).
    launchers: tuple[tuple[str, ...], ...] | None = None

    def matches(self, image: str) -> bool:
        return fnmatch.fnmatchcase(image, self.image)


@dataclass(frozen=True, slots=True)
class Launch:
    """What to run for one container: argv (the entry's command and the container's args) and whether the
    stand-in's zygote can fork it (`zygote_args` is then the argv after `python -m infer_ctl.sandbox.modelserver`)."""

    argv: tuple[str, ...]
    zygote_args: tuple[str, ...] | None


class LaunchError(ValueError):
    """The container cannot be started as written (kubelet: CreateContainerError)."""


def _vllm_launchers() -> tuple[tuple[str, ...], ...]:
    return (("vllm", "serve"), *((p, "-m", "vllm.entrypoints.openai.api_server") for p in _PYTHONS))


def _sglang_launchers() -> tuple[tuple[str, ...], ...]:
    return tuple((p, "-m", "sglang.launch_server") for p in _PYTHONS)


def builtin_entries(python: str = sys.executable) -> tuple[ImageEntry, ...]:
    out: list[ImageEntry] = []
    for engine, repository, launchers in (("vllm", "vllm/vllm-openai", _vllm_launchers()),
                                          ("sglang", "lmsysorg/sglang", _sglang_launchers())):
        for prefix in ("", "docker.io/"):
            out.append(ImageEntry(f"{prefix}{repository}*", (python, "-m", STANDIN_MODULE, engine), launchers))
    return tuple(out)


@dataclass(frozen=True, slots=True)
class ImageTable:
    entries: tuple[ImageEntry, ...]

    @classmethod
    def with_builtins(cls, user: Sequence[ImageEntry] = (), python: str = sys.executable) -> ImageTable:
        return cls((*user, *builtin_entries(python)))

    def match(self, image: str) -> ImageEntry | None:
        return next((e for e in self.entries if e.matches(image)), None)

    def launch(self, container: Mapping[str, Any]) -> Launch | None:
        """The argv for `container` (None: no entry matches its image); LaunchError for a built-in entry's
        container whose command is not one of the image's launchers."""
        image = str(container.get("image") or "")
        entry = self.match(image)
        if entry is None:
            return None
        command = tuple(str(c) for c in container.get("command") or ())
        args = tuple(str(a) for a in container.get("args") or ())
        if entry.launchers is None:
            argv = (*entry.command, *command, *args)
        elif command and command not in entry.launchers:
            known = "; ".join(" ".join(launcher) for launcher in entry.launchers)
            raise LaunchError(f"command {list(command)} of image {image}: the sandbox's stand-in for it runs the "
                              f"image's entrypoint or one of its launchers ({known}) only")
        else:
            argv = (*entry.command, *args)
        head = argv[1:3]
        zygote_args = argv[3:] if head == ("-m", STANDIN_MODULE) and len(argv) > 3 else None
        return Launch(argv, zygote_args)


def engine_version(image: str) -> str:
    """The engine version from an image's tag: "0.11.0" from "vllm/vllm-openai:v0.11.0"; "" for latest, no tag or
    a digest (the newest behaviour)."""
    if "@" in image:
        return ""
    last = image.rpartition("/")[2]
    if ":" not in last:
        return ""
    tag = last.rpartition(":")[2]
    if tag in ("", "latest", "nightly"):
        return ""
    return tag[1:] if tag[:1] in ("v", "V") and tag[1:2].isdigit() else tag


def parse_image_table(data: Any, source: str = "image table") -> tuple[ImageEntry, ...]:
    """The user's entries from a loaded YAML document; ImageTableError naming the entry and field."""
    if not isinstance(data, Mapping) or set(data) - {"images"}:
        raise ImageTableError(f"{source}: expected a mapping with the one key 'images' (a list of "
                              "{image, command} entries)")
    items = data.get("images") or []
    if not isinstance(items, list):
        raise ImageTableError(f"{source}: images: expected a list, got {type(items).__name__}")
    entries = []
    for index, item in enumerate(items):
        where = f"{source}: images[{index}]"
        if not isinstance(item, Mapping):
            raise ImageTableError(f"{where}: expected a mapping with image and command")
        unknown = sorted(set(item) - {"image", "command"})
        if unknown:
            raise ImageTableError(f"{where}: unknown field(s) {', '.join(map(str, unknown))} (expected image, "
                                  "command)")
        image = item.get("image")
        if not isinstance(image, str) or not image.strip():
            raise ImageTableError(f"{where}.image: expected a non-empty string (an fnmatch glob on the image "
                                  f"reference), got {image!r}")
        command = item.get("command")
        if not isinstance(command, list) or not command or not all(isinstance(c, str) and c for c in command):
            raise ImageTableError(f"{where}.command (image {image!r}): expected a non-empty list of non-empty "
                                  f"strings (argv), got {command!r}")
        entries.append(ImageEntry(image, tuple(command)))
    return tuple(entries)


def load_image_table(path: Path | None, python: str = sys.executable) -> ImageTable:
    """The user's file (if any) before the built-in entries; ImageTableError for an unreadable or bad file."""
    if path is None:
        return ImageTable.with_builtins(python=python)
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as e:
        raise ImageTableError(f"{path}: cannot read: {e.strerror or e}") from None
    except yaml.YAMLError as e:
        raise ImageTableError(f"{path}: not YAML: {e}") from None
    return ImageTable.with_builtins(parse_image_table(data, str(path)), python=python)
