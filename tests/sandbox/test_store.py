"""Store invariants: the informer contract (a list plus the watch from its resourceVersion rebuilds the state)
and one monotonic resourceVersion."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from infer_ctl.sandbox.selectors import parse_label_selector
from infer_ctl.sandbox.store import ApiError, Store

NAMES = st.sampled_from(["a", "b", "c", "d"])
OPS = st.lists(st.one_of(
    st.tuples(st.just("create"), NAMES, st.sampled_from(["x", "y"]), st.booleans()),
    st.tuples(st.just("patch"), NAMES, st.sampled_from(["x", "y"]), st.booleans()),
    st.tuples(st.just("delete"), NAMES, st.just(""), st.booleans()),
    st.tuples(st.just("release"), NAMES, st.just(""), st.booleans()),
), max_size=25)


def apply(store: Store, op: tuple[str, str, str, bool]) -> None:
    rt = store.type("", "v1", "configmaps")
    kind, name, label, hold = op
    try:
        if kind == "create":
            meta: dict[str, Any] = {"name": name, "labels": {"app": label}}
            if hold:
                meta["finalizers"] = ["test/hold"]
            store.create(rt, "default", {"metadata": meta, "data": {"v": label}})
        elif kind == "patch":
            store.patch(rt, "default", name, "application/merge-patch+json",
                        {"metadata": {"labels": {"app": label}}, "data": {"held": str(hold)}})
        elif kind == "delete":
            store.delete(rt, "default", name)
        else:
            store.patch(rt, "default", name, "application/merge-patch+json", {"metadata": {"finalizers": None}})
    except ApiError:
        pass  # conflicts and missing objects are part of the sequence


@settings(max_examples=150, deadline=None)
@given(OPS, OPS, st.sampled_from(["", "app=x"]))
def test_a_list_and_the_watch_from_its_resource_version_rebuild_the_current_state(
        before: list[tuple[str, str, str, bool]], after: list[tuple[str, str, str, bool]], selector: str) -> None:
    store = Store()
    rt = store.type("", "v1", "configmaps")
    labels = parse_label_selector(selector)
    for op in before:
        apply(store, op)
    cache = {o["metadata"]["name"]: o for o in store.list_objects(rt, "default", labels)}
    rv = str(store.resource_version)
    versions = [store.resource_version]
    for op in after:
        apply(store, op)
        versions.append(store.resource_version)
    watch, events = store.watch(rt, "default", labels, lambda _o: True, rv)
    store.unwatch(watch)
    for event_type, obj in events:
        if event_type == "DELETED":
            cache.pop(obj["metadata"]["name"], None)
        else:
            cache[obj["metadata"]["name"]] = obj
    assert cache == {o["metadata"]["name"]: o for o in store.list_objects(rt, "default", labels)}
    assert versions == sorted(versions)
    event_versions = [int(obj["metadata"]["resourceVersion"]) for _t, obj in events]
    assert event_versions == sorted(event_versions) and all(v > int(rv) for v in event_versions)
