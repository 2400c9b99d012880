"""Where the cached tier's prefetch downloads a model from: `spec.model.uri` read as a Hugging Face Hub source.

The prefetch Pod runs `hf download` (huggingface_hub >= 1.0; `huggingface-cli` was removed in 1.0), so it can
fetch what the Hub serves and nothing else:

- no uri: the model's name is the Hub repository (`spec.model.name`, e.g. `meta-llama/Llama-3.1-8B-Instruct`);
- `hf://org/name` or `hf://name`, optionally `@revision` (a branch, tag or commit): `hf download org/name
  --revision revision`;
- any other scheme (s3://, gs://, pvc://, oci://, https://...) is refused for the cached tier with the reason
  (the controller says so in a Warning Event and starts no prefetch Pod): each needs its own client and
  credentials in the runtime's image, which infer-ctl cannot assume, and a pvc:// model is already on a volume
  (no node copy would make its start faster). The model server itself still loads from such a uri.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from infer_ctl.core.errors import FieldError, SpecError

URI_FIELD = "spec.model.uri"
# A Hub repository id as huggingface_hub's `validate_repo_id` (utils/_validators.py) checks it: `name` or
# `namespace/name`, each 1-96 of letters, digits, '-', '_', '.', neither starting nor ending with '-' or '.';
# no '--' or '..'; not ending in '.git'.
_REPO_PART = r"[A-Za-z0-9_](?:[A-Za-z0-9_.-]{0,94}[A-Za-z0-9_])?"
_REPO = re.compile(rf"^(?:{_REPO_PART}/)?{_REPO_PART}$")
_REVISION = re.compile(r"^[^\s@]+$")


@dataclass(frozen=True, slots=True)
class HubSource:
    repo: str  # the Hub repository id
    revision: str | None = None  # None: the repository's default branch


def hub_source(uri: str | None, name: str) -> HubSource:
    """The Hub repository (and revision) to prefetch for a model with `uri` (None: none) and `name`;
    SpecError naming spec.model.uri (or spec.model.name) and the problem.

    E.g. "hf://Qwen/Qwen2.5-7B-Instruct@v1.1" -> HubSource("Qwen/Qwen2.5-7B-Instruct", "v1.1")."""
    if not uri:
        if not _valid_repo(name):
            raise _error("spec.model.name", f"Invalid value: {name!r}: without spec.model.uri the name is "
                                                "the Hugging Face repository to prefetch (org/name)")
        return HubSource(name)
    scheme, sep, rest = uri.partition("://")
    if not sep:
        raise _error(URI_FIELD, f"Invalid value: {uri!r}: a URI with a scheme is expected "
                                    "(hf://org/name[@revision])")
    if scheme.lower() != "hf":
        raise _error(URI_FIELD, f"Unsupported value: {uri!r}: the cached tier prefetches from the Hugging Face "
                                    f"Hub only (hf://org/name[@revision], or no uri); a {scheme}:// model is not "
                                    "copied to the nodes' caches")
    repo, at, revision = rest.partition("@")
    if not _valid_repo(repo):
        raise _error(URI_FIELD, f"Invalid value: {uri!r}: {repo!r} is not a Hugging Face repository id "
                                    "(name or org/name: letters, digits, '-', '_', '.')")
    if at and not _REVISION.match(revision):
        raise _error(URI_FIELD, f"Invalid value: {uri!r}: the revision after '@' must be a branch, tag or "
                                    "commit (no spaces)")
    return HubSource(repo, revision if at else None)


def _error(path: str, message: str) -> SpecError:
    return SpecError([FieldError(path, message)])


def _valid_repo(repo: str) -> bool:
    return bool(_REPO.match(repo)) and "--" not in repo and ".." not in repo and not repo.endswith(".git")
