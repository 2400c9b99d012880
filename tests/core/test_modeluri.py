"""spec.model.uri read as the prefetch's Hugging Face Hub source: hf:// (with a revision) or the model's name;
every other scheme refused for the cached tier with the field named."""

from __future__ import annotations

import pytest

from infer_ctl.core.errors import SpecError
from infer_ctl.core.modeluri import HubSource, hub_source

NAME = "meta-llama/Llama-3.1-8B-Instruct"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.mark.parametrize(("uri", "expected"), [
    (None, HubSource(NAME)),
    ("", HubSource(NAME)),
    ("hf://Qwen/Qwen2.5-7B-Instruct", HubSource("Qwen/Qwen2.5-7B-Instruct")),
    ("hf://Qwen/Qwen2.5-7B-Instruct@v1.1", HubSource("Qwen/Qwen2.5-7B-Instruct", "v1.1")),
    (f"hf://gpt2@{COMMIT}", HubSource("gpt2", COMMIT)),
    ("HF://org/model_v2", HubSource("org/model_v2")),
], ids=["no uri: the name", "an empty uri: the name", "hf:// a repository", "hf:// with a tag",
        "hf:// a single-name repository at a commit", "the scheme in capitals"])
def test_a_hub_source_comes_from_the_uri_else_the_name(uri: str | None, expected: HubSource) -> None:
    assert hub_source(uri, NAME) == expected


@pytest.mark.parametrize(("uri", "name", "field", "says"), [
    ("s3://bucket/llama", NAME, "spec.model.uri", "Unsupported value"),
    ("gs://bucket/llama", NAME, "spec.model.uri", "a gs:// model is not copied"),
    ("pvc://models/llama", NAME, "spec.model.uri", "Hugging Face Hub only"),
    ("org/name", NAME, "spec.model.uri", "a URI with a scheme is expected"),
    ("hf://a/b/c", NAME, "spec.model.uri", "not a Hugging Face repository id"),
    ("hf://org/-bad", NAME, "spec.model.uri", "not a Hugging Face repository id"),
    ("hf://org/a--b", NAME, "spec.model.uri", "not a Hugging Face repository id"),
    ("hf://org/repo.git", NAME, "spec.model.uri", "not a Hugging Face repository id"),
    ("hf://org/name@", NAME, "spec.model.uri", "the revision after '@'"),
    (None, "my model", "spec.model.name", "the Hugging Face repository to prefetch"),
], ids=["s3 is refused", "gs is refused", "pvc is refused", "no scheme", "three path parts", "a leading dash",
        "a double dash", "a .git suffix", "an empty revision", "no uri and a name that is no repository"])
def test_a_source_the_prefetch_cannot_fetch_is_refused_naming_the_field(uri: str | None, name: str, field: str,
                                                                        says: str) -> None:
    with pytest.raises(SpecError) as refused:
        hub_source(uri, name)
    [error] = refused.value.errors
    assert error.path == field and says in error.message, str(refused.value)
