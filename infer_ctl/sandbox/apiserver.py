"""The sandbox's Kubernetes API server: an aiohttp application over the sandbox `Store`.

On aiohttp's public server API (`web.Application`, `web.AppRunner`, `web.TCPSite` on 127.0.0.1,
`web.StreamResponse` for watches); what makes it a Kubernetes API server is written here:
- resources: every resource request is served from the `Store` (see `store.py` for the semantics), with
  kube-apiserver's status codes (201 on create, 202 on deferred deletion, 409, 410, 415, 422 with causes, as `Status`
  bodies rendered here) and a watch that honours `resourceVersion`, `timeoutSeconds` and bookmarks, and ends when
  the server stops;
- discovery: `/`, `/api`, `/apis`, `/apis/GROUP`, `/api/v1`, `/apis/GROUP/VERSION`, `/version`, computed from
  the store's resource types on each request, so a CRD's resources appear when it is applied and go when it is
  deleted; versions in kube-apiserver's priority order (GA, beta, alpha; the highest first), the first one
  preferred; and OpenAPI v3 (`/openapi/v3` and one document per group-version, `openapi.py`), which `kubectl
  explain` reads;
- faults: `add_fault(Fault(...))` (the fault proxy's rule, `faultproxy.Fault`) answers matching requests ahead
  of the store with a `Status` error in kube-apiserver's form, or delays them; tests inject API failures so.

`ApiServerSite(api, port)` serves it on 127.0.0.1 (`await site.start()`, `site.url`, `await site.stop()`).
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import random
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp.web
import yaml

from infer_ctl.sandbox import conversion, openapi, tables
from infer_ctl.sandbox import patch as patching
from infer_ctl.sandbox.faultproxy import Fault, status_body
from infer_ctl.sandbox.resources import ResourceType
from infer_ctl.sandbox.selectors import SelectorError, parse_field_selector, parse_label_selector
from infer_ctl.sandbox.store import ApiError, Gone, Obj, Store, bad_request, delete_returns_object, details

log = logging.getLogger(__name__)

_JSON_TYPES = ("application/json", "application/json-patch+json", "application/merge-patch+json",
               "application/strategic-merge-patch+json")


@dataclass(frozen=True)
class ApiPath:
    """A Kubernetes API path's parts; `group` is None for a path that is not a resource path ('' is the core
    group)."""

    group: str | None = None
    version: str | None = None
    plural: str | None = None
    namespace: str | None = None
    name: str | None = None
    subresource: str | None = None


def parse_api_path(path: str) -> ApiPath:
    """`/api/v1/namespaces/ns/pods/p/status` -> group '', version v1, pods, ns, p, status.

    `/api/v1/namespaces` and `/api/v1/namespaces/NAME[/status|finalize]` name the namespaces resource itself, not
    a namespace's scope.
    """
    parts = [p for p in path.split("/") if p]
    if len(parts) >= 2 and parts[0] == "api":
        group, version, rest = "", parts[1], parts[2:]
    elif len(parts) >= 3 and parts[0] == "apis":
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        return ApiPath()
    namespace = None
    if rest and rest[0] == "namespaces" and (len(rest) >= 4 or (len(rest) == 3 and rest[2] not in
                                                                  ("status", "finalize"))):
        namespace, rest = rest[1], rest[2:]
    plural = rest[0] if rest else None
    name = rest[1] if len(rest) > 1 else None
    subresource = "/".join(rest[2:]) or None
    return ApiPath(group, version, plural, namespace, name, subresource)


@dataclass(frozen=True)
class _Call:
    """One request as the serving methods read it: the aiohttp request, its parsed path, query and body."""

    raw: aiohttp.web.BaseRequest
    path: ApiPath
    params: Mapping[str, str]
    body: bytes
    data: Any  # the body decoded from JSON, when it is JSON; else None


# ------------------------------------------------------------------------------------------------ discovery

_KUBE_VERSION = re.compile(r"v(\d+)(?:(alpha|beta)(\d+))?")


def version_priority(version: str) -> tuple[int, int, int, str]:
    """kube-apiserver's order of an API group's versions (the first is preferred): GA, then beta, then alpha, each
    with the highest number first (v2, v1, v1beta2, v1beta1, v1alpha1); names not of that form last, by name."""
    m = _KUBE_VERSION.fullmatch(version)
    if m is None:
        return (3, 0, 0, version)
    stage = {None: 0, "beta": 1, "alpha": 2}[m.group(2)]
    return (stage, -int(m.group(1)), -int(m.group(3) or 0), "")


def _not_found(what: str = "") -> ApiError:
    suffix = f" ({what})" if what else ""
    return ApiError(404, "NotFound", f"the server could not find the requested resource{suffix}")


def group_versions(types: Iterable[ResourceType]) -> dict[str, list[str]]:
    """Served group -> its versions by priority ('' is the core group), groups by name."""
    versions: dict[str, set[str]] = {}
    for rt in types:
        versions.setdefault(rt.group, set()).add(rt.version)
    return {group: sorted(versions[group], key=version_priority) for group in sorted(versions)}


def _api_group(group: str, versions: list[str]) -> dict[str, Any]:
    listed = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
    return {"name": group, "versions": listed, "preferredVersion": listed[0]}


def discovery_root(types: Iterable[ResourceType]) -> dict[str, Any]:
    """`/`: the paths the server serves."""
    paths = {"/", "/api", "/apis", "/version"}
    for group, versions in group_versions(types).items():
        if group:
            paths.add(f"/apis/{group}")
        paths.update(f"/apis/{group}/{v}" if group else f"/api/{v}" for v in versions)
    return {"paths": sorted(paths)}


def discovery_core() -> dict[str, Any]:
    """`/api`: the core group's versions."""
    return {"kind": "APIVersions", "versions": ["v1"]}


def discovery_groups(types: Iterable[ResourceType]) -> dict[str, Any]:
    """`/apis`: every named group with its versions."""
    return {"apiVersion": "v1", "kind": "APIGroupList",
            "groups": [_api_group(g, vs) for g, vs in group_versions(types).items() if g]}


def discovery_group(types: Iterable[ResourceType], group: str) -> dict[str, Any]:
    """`/apis/GROUP`: one group's versions; 404 for a group that is not served."""
    versions = group_versions(types).get(group) if group else None
    if not versions:
        raise _not_found()
    return {"apiVersion": "v1", "kind": "APIGroup", **_api_group(group, versions)}


# subresource -> (its kind, None for the resource's own; its (group, version), None for the resource's; verbs)
_SUBRESOURCES: dict[str, tuple[str | None, tuple[str, str] | None, tuple[str, ...]]] = {
    "status": (None, None, ("get", "patch", "update")),
    "scale": ("Scale", ("autoscaling", "v1"), ("get", "patch", "update")),
    "binding": ("Binding", None, ("create",)),
    "eviction": ("Eviction", ("policy", "v1"), ("create",)),
    "finalize": (None, None, ("update",)),
}


def discovery_version(types: Iterable[ResourceType], group: str, version: str) -> dict[str, Any]:
    """`/api/v1`, `/apis/GROUP/VERSION`: the resources of one group-version, each followed by its subresources
    (which name the resource's kind and verbs); 404 for a group-version that is not served."""
    served = sorted((rt for rt in types if (rt.group, rt.version) == (group, version)), key=lambda rt: rt.plural)
    if not served:
        raise _not_found()
    resources: list[dict[str, Any]] = []
    for rt in served:
        resources.append({"name": rt.plural, "kind": rt.kind, "singularName": rt.singular,
                          "shortNames": list(rt.short_names), "categories": list(rt.categories),
                          "verbs": list(rt.verbs), "namespaced": rt.namespaced})
        for sub in sorted(rt.subresources):
            # as kube-apiserver lists them: no singular or short names (kubectl would warn that a short name "could
            # also match" each), and the kind (and group-version) the subresource takes
            kind, gv, verbs = _SUBRESOURCES.get(sub, (None, None, ("get", "patch", "update")))
            entry: dict[str, Any] = {"name": f"{rt.plural}/{sub}", "singularName": "", "namespaced": rt.namespaced,
                                     "kind": kind or rt.kind, "verbs": list(verbs)}
            if gv is not None:
                entry["group"], entry["version"] = gv
            resources.append(entry)
    return {"apiVersion": "v1", "kind": "APIResourceList", "groupVersion": f"{group}/{version}" if group else version,
            "resources": resources}


# ------------------------------------------------------------------------------------------------ the server


@dataclass(kw_only=True)
class SandboxApiServer:
    """A Kubernetes API server whose resources live in a `Store`: `handle` is its aiohttp handler,
    `application()` the aiohttp application; serve it with `ApiServerSite(api, port)`."""

    store: Store = field(default_factory=Store)
    bookmark_interval_s: float = 60.0
    faults: list[Fault] = field(default_factory=list)
    _rng: random.Random = field(default_factory=lambda: random.Random(0), repr=False)
    # (group, version) -> (hash, OpenAPI v3 document)
    _openapi_documents: dict[tuple[str, str], tuple[str, dict[str, Any]]] = field(default_factory=dict, repr=False)

    def add_fault(self, fault: Fault) -> Fault:
        """Answer the requests `fault` matches (method, a regex searched in the path with its query, watch or not,
        how many times, with what probability) with its `Status` error, after its delay, ahead of the store; with
        `status` None, only delay them. `fault.injected` counts the requests it answered. Remove it from
        `faults` to end it before its `times` run out."""
        self.faults.append(fault)
        return fault

    def application(self) -> aiohttp.web.Application:
        app = aiohttp.web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        return app

    def _openapi_v3(self, group: str, version: str) -> dict[str, Any]:
        """One group-version's OpenAPI v3 document, built again only when its hash changes (a CRD applied)."""
        types = self.store.types()
        digest = openapi.document_hash(types, group, version)
        cached = self._openapi_documents.get((group, version))
        if cached is not None and cached[0] == digest:
            return cached[1]
        document = openapi.group_version_document(types, group, version)
        if document is None:
            raise _not_found()
        self._openapi_documents[(group, version)] = (digest, document)
        return document

    def _kube_version(self) -> dict[str, str]:
        return {"major": "1", "minor": "37", "gitVersion": "v1.37.0-infer-ctl-sandbox", "gitTreeState": "clean",
                "goVersion": "n/a", "compiler": "python", "platform": "linux/amd64"}

    async def handle(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        """Answer one request: an injected fault, else discovery or a resource from the store."""
        try:
            if self.faults and (response := await self._fault(raw_request)) is not None:
                return response
            body = await raw_request.read()
            data: Any = None
            if body and raw_request.content_type in _JSON_TYPES:
                try:
                    data = json.loads(body)
                except ValueError:
                    data = None
            request = _Call(raw_request, parse_api_path(raw_request.path), dict(raw_request.query), body, data)
            return await self._direct(request)
        except Exception as e:
            log.exception("internal error serving %s %s", raw_request.method, raw_request.path)
            return _status(ApiError(500, "InternalError", f"an error on the server has prevented the request "
                                                          f"from succeeding: {e!r}"))

    async def _fault(self, raw: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse | None:
        """The answer of the first fault that matches the request (after its delay), or None to serve it."""
        path_qs = raw.rel_url.raw_path_qs
        is_watch = raw.method == "GET" and raw.query.get("watch") in ("true", "1")
        for fault in tuple(self.faults):  # tests add and remove faults from other threads
            if fault.matches(raw.method, path_qs, is_watch, self._rng):
                fault.injected += 1
                if fault.delay_s:
                    await asyncio.sleep(fault.delay_s)
                if fault.status is None:
                    return None
                return _json(status_body(fault.status, f"injected by a fault of the sandbox API server: "
                                                       f"{fault.method or '*'} {fault.path}"), fault.status)
        return None

    async def _direct(self, request: _Call) -> aiohttp.web.StreamResponse:
        """Serve a request: resources from the store, discovery from the store's resource types."""
        raw = request.raw
        path = raw.path.rstrip("/") or "/"
        try:
            if (request.path.group, request.path.version, request.path.plural) == (
                    "authorization.k8s.io", "v1", "selfsubjectaccessreviews"):
                if raw.method != "POST" or request.path.name is not None:  # a review: answered, not stored
                    raise _method_not_allowed(raw.method)
                return _json(_access_review(self._body(request)), 201)
            if request.path.plural is not None:
                return await self._serve(request)
            if raw.method != "GET":
                raise _method_not_allowed(raw.method)
            return _json(self._discovery(path, request.path))
        except ApiError as e:
            return _status(e)

    def _discovery(self, path: str, api_path: ApiPath) -> dict[str, Any]:
        """The discovery document (or OpenAPI, or version) at `path`."""
        types = self.store.types()
        if path == "/":
            return discovery_root(types)
        if path == "/version":
            return self._kube_version()
        if path == "/api":
            return discovery_core()
        if path == "/apis":
            return discovery_groups(types)
        if path == "/openapi/v3":
            return openapi.discovery(types)
        if match := re.fullmatch(r"/openapi/v3/apis/([^/]+)/([^/]+)|/openapi/v3/api/([^/]+)", path):
            group, version = (match.group(1), match.group(2)) if match.group(1) else ("", match.group(3))
            return self._openapi_v3(group, version)
        if match := re.fullmatch(r"/apis/([^/]+)", path):
            return discovery_group(types, match.group(1))
        if api_path.group is not None and api_path.version is not None:
            return discovery_version(types, api_path.group, api_path.version)
        raise _not_found(path)

    # ----------------------------------------------------------------------------------------- serving

    async def _serve(self, request: _Call) -> aiohttp.web.StreamResponse:
        raw = request.raw
        k8s = request.path
        assert k8s.group is not None and k8s.version is not None and k8s.plural is not None
        rt = self.store.type(k8s.group, k8s.version, k8s.plural)
        if k8s.namespace is not None and not rt.namespaced:
            raise ApiError(404, "NotFound", f"the server could not find the requested resource ({rt.plural} is "
                                            "cluster-scoped)")
        ns = k8s.namespace if rt.namespaced else None
        q = request.params
        method = raw.method
        if k8s.subresource is not None:
            return await self._serve_subresource(request, rt, ns, str(k8s.name), k8s.subresource)
        if k8s.name is None:
            if method == "GET":
                if q.get("watch") in ("true", "1"):
                    return await self._serve_watch(raw, rt, ns, q)
                listing = self._list(rt, ns, q)
                if tables.wants_table(raw.headers.get("Accept", "")):
                    return _json(tables.table(rt, listing["items"], self.store.clock(),
                                              listing["metadata"]["resourceVersion"]))
                return _json(listing)
            if method == "POST":
                body = self._body(request)
                obj, warnings = self.store.create(rt, ns, body, validate=True,
                                                  field_validation=_field_validation(q), dry_run=_dry_run(q))
                return _json(obj, 201, warnings)
            if method == "DELETE":
                return _json(self._delete_collection(rt, ns, q))
            raise _method_not_allowed(method)
        name = k8s.name
        if method == "GET":
            obj = self.store.get(rt, ns, name)
            if tables.wants_table(raw.headers.get("Accept", "")):
                return _json(tables.table(rt, [obj], self.store.clock(), obj["metadata"]["resourceVersion"]))
            return _json(obj)
        if method == "PUT":
            obj, warnings = self.store.update(rt, ns, name, self._body(request), validate=True,
                                              field_validation=_field_validation(q), dry_run=_dry_run(q))
            return _json(obj, 200, warnings)
        if method == "PATCH":
            return await self._serve_patch(request, rt, ns, name, None)
        if method == "DELETE":
            options = self._delete_options(request)
            accepted = options.pop("orphan_dependents") is False
            obj, removed = self.store.delete(rt, ns, name, **options)
            # kube-apiserver answers 202 only for a deferred deletion that asked for orphanDependents=false.
            status = 202 if accepted and not removed else 200
            if removed and not delete_returns_object(rt):
                meta = obj["metadata"]
                return _json({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                              "details": details(meta["name"], rt.group, rt.plural, uid=meta["uid"])}, status)
            return _json(obj, status)
        raise _method_not_allowed(method)

    async def _serve_patch(self, request: _Call, rt: ResourceType, ns: str | None, name: str,
                           subresource: str | None) -> aiohttp.web.StreamResponse:
        raw = request.raw
        q = request.params
        patch_type = raw.content_type
        if patch_type == "application/apply-patch+yaml" and not q.get("fieldManager"):
            raise ApiError(422, "Invalid", 'PatchOptions.meta.k8s.io "" is invalid: fieldManager: Required value: is '
                                           'required for apply patch', details=details(
                                               "", "meta.k8s.io", "PatchOptions", causes=[{
                                                   "reason": "FieldValueRequired", "field": "fieldManager",
                                                   "message": "Required value: is required for apply patch"}]))
        body = self._body(request, yaml_ok=patch_type == "application/apply-patch+yaml")
        if patch_type == "application/apply-patch+yaml" and self.store.find(rt, ns, name) is None:
            obj, warnings = self.store.create(rt, ns, body, validate=True, field_validation=_field_validation(q),
                                              dry_run=_dry_run(q))
            return _json(obj, 201, warnings)
        obj, warnings = self.store.patch(rt, ns, name, patch_type, body, subresource=subresource, validate=True,
                                         field_validation=_field_validation(q), dry_run=_dry_run(q))
        return _json(obj, 200, warnings)

    async def _serve_subresource(self, request: _Call, rt: ResourceType, ns: str | None, name: str,
                                 subresource: str) -> aiohttp.web.StreamResponse:
        raw = request.raw
        method = raw.method
        if subresource not in rt.subresources:
            raise ApiError(404, "NotFound", f"the server could not find the requested resource "
                                            f"({rt.group_resource}/{subresource})")
        if subresource == "status":
            if method == "GET":
                return _json(self.store.get(rt, ns, name))
            if method == "PUT":
                obj, warnings = self.store.update(rt, ns, name, self._body(request), subresource="status",
                                                  validate=True, field_validation=_field_validation(request.params))
                return _json(obj, 200, warnings)
            if method == "PATCH":
                return await self._serve_patch(request, rt, ns, name, "status")
        elif subresource == "scale" and rt.scale is not None:
            if method in ("GET", "PUT", "PATCH"):
                return self._serve_scale(request, rt, ns, name, method)
        elif subresource == "binding" and method == "POST":
            body = self._body(request)
            target = (body.get("target") or {}).get("name") if isinstance(body, Mapping) else None
            if not target:
                raise ApiError(422, "Invalid", "Binding target.name: Required value")
            self.store.bind(str(ns), name, str(target))
            return _json({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                          "code": 201}, 201)
        elif subresource == "eviction" and method == "POST":
            self.store.delete(rt, ns, name)
            return _json({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                          "code": 201}, 201)
        elif subresource == "finalize" and method == "PUT":
            obj, warnings = self.store.update(rt, ns, name, self._body(request))
            return _json(obj)
        raise _method_not_allowed(method)

    def _serve_scale(self, request: _Call, rt: ResourceType, ns: str | None, name: str,
                     method: str) -> aiohttp.web.StreamResponse:
        """GET, PUT or PATCH of the scale subresource."""
        if method == "GET":
            return _json(self.store.scale_of(rt, self.store.get(rt, ns, name)))
        if method == "PUT":
            return _json(self.store.update_scale(rt, ns, name, self._body(request), check_rv=True))
        raw = request.raw
        current = self.store.scale_of(rt, self.store.get(rt, ns, name))
        body = self._body(request)
        try:
            if raw.content_type == "application/json-patch+json":
                patched = patching.json_patch(current, body)
            else:
                patched = patching.merge_patch(current, body)
        except patching.PatchError as e:
            raise ApiError(e.status, "Invalid" if e.status == 422 else "BadRequest", str(e)) from None
        return _json(self.store.update_scale(rt, ns, name, patched, check_rv=False))

    def _body(self, request: _Call, *, yaml_ok: bool = False) -> Any:
        if request.data is not None:
            return request.data
        if not request.body:
            raise bad_request("the request body is empty")
        try:
            return yaml.safe_load(request.body) if yaml_ok else json.loads(request.body)
        except (ValueError, yaml.YAMLError) as e:
            raise bad_request(f"the body of the request could not be decoded: {e}") from None

    def _list(self, rt: ResourceType, ns: str | None, q: Mapping[str, str]) -> Obj:
        try:
            labels = parse_label_selector(q.get("labelSelector"))
            fields = parse_field_selector(q.get("fieldSelector"), rt.kind, conversion.field_labels(rt))
        except SelectorError as e:
            raise bad_request(str(e)) from None
        items = self.store.list_objects(rt, ns, labels, fields)
        if rt.crd is None:  # built-in list items carry no apiVersion/kind on the wire; custom resources' do
            items = [{k: v for k, v in item.items() if k not in ("apiVersion", "kind")} for item in items]
        rv = str(self.store.resource_version)
        meta: Obj = {"resourceVersion": rv}
        start = 0
        if q.get("continue"):
            try:
                token = json.loads(base64.urlsafe_b64decode(q["continue"].encode()))
                start, rv = int(token["start"]), str(token["rv"])
                meta["resourceVersion"] = rv
            except (ValueError, KeyError, TypeError):
                raise ApiError(410, "Expired", "the provided continue parameter is not valid") from None
        limit = int(_number(q, "limit") or 0)
        if limit > 0:
            page = items[start:start + limit]
            remaining = len(items) - start - len(page)
            if remaining > 0:
                meta["continue"] = base64.urlsafe_b64encode(
                    json.dumps({"start": start + limit, "rv": rv}).encode()).decode()
                meta["remainingItemCount"] = remaining
            items = page
        else:
            items = items[start:]
        return {"kind": f"{rt.kind}List", "apiVersion": rt.api_version, "metadata": meta, "items": items}

    def _delete_options(self, request: _Call) -> dict[str, Any]:
        q = request.params
        opts: Mapping[str, Any] = {}
        if request.body:
            body = self._body(request)
            opts = body if isinstance(body, Mapping) else {}
        orphan = opts.get("orphanDependents", {"true": True, "false": False}.get(q.get("orphanDependents", "")))
        grace = opts.get("gracePeriodSeconds", q.get("gracePeriodSeconds"))
        propagation = opts.get("propagationPolicy", q.get("propagationPolicy"))
        if opts.get("orphanDependents") is True or q.get("orphanDependents") == "true":
            propagation = "Orphan"
        try:
            grace_s = None if grace is None else int(grace)
        except ValueError:
            raise bad_request(f"gracePeriodSeconds: invalid value {grace!r}") from None
        return {"grace_period_s": grace_s, "propagation": propagation, "orphan_dependents": orphan,
                "preconditions": opts.get("preconditions") or {}, "dry_run": _dry_run(q) or
                bool(opts.get("dryRun"))}

    def _delete_collection(self, rt: ResourceType, ns: str | None, q: Mapping[str, str]) -> Obj:
        listing = self._list(rt, ns, {k: v for k, v in q.items() if k != "limit"})
        for obj in listing["items"]:
            meta = obj["metadata"]
            if self.store.find(rt, meta.get("namespace"), meta["name"]) is not None:
                self.store.delete(rt, meta.get("namespace"), meta["name"])
        return listing

    async def _serve_watch(self, raw: aiohttp.web.BaseRequest, rt: ResourceType, ns: str | None,
                           q: Mapping[str, str]) -> aiohttp.web.StreamResponse:
        try:
            labels = parse_label_selector(q.get("labelSelector"))
            fields = parse_field_selector(q.get("fieldSelector"), rt.kind, conversion.field_labels(rt))
        except SelectorError as e:
            raise bad_request(str(e)) from None
        timeout_s = _number(q, "timeoutSeconds")
        bookmarks = q.get("allowWatchBookmarks") in ("true", "1")
        send_initial = q.get("sendInitialEvents") == "true"
        if q.get("sendInitialEvents") not in (None, "") and q.get("resourceVersionMatch") != "NotOlderThan":
            raise ApiError(422, "Invalid", 'ListOptions.meta.k8s.io "" is invalid: resourceVersionMatch: Forbidden: '
                                           'sendInitialEvents requires setting resourceVersionMatch to NotOlderThan',
                           details=details("", "meta.k8s.io", "ListOptions", causes=[{
                               "reason": "FieldValueForbidden", "field": "resourceVersionMatch",
                               "message": "Forbidden: sendInitialEvents requires setting resourceVersionMatch to "
                                          "NotOlderThan"}]))
        response = aiohttp.web.StreamResponse(status=200)
        response.content_type = "application/json"
        response.headers["Transfer-Encoding"] = "chunked"
        try:
            watch, initial = self.store.watch(rt, ns, labels, fields, None if send_initial else
                                              q.get("resourceVersion"))
        except Gone as e:
            await response.prepare(raw)
            await response.write(_event("ERROR", ApiError(410, "Expired", str(e)).status()))
            await response.write_eof()
            return response
        await response.prepare(raw)
        loop = asyncio.get_running_loop()
        deadline = None if timeout_s is None else loop.time() + timeout_s
        try:
            as_table = tables.wants_table(raw.headers.get("Accept", ""))
            headers_sent = False

            def encode(event_type: str, obj: Mapping[str, Any]) -> bytes:
                """kubectl get -w asks for Tables: one row per event, column definitions in the first only."""
                nonlocal headers_sent
                if not as_table:
                    return _event(event_type, obj)
                table = tables.table(rt, [obj], self.store.clock(), str(obj["metadata"]["resourceVersion"]))
                if headers_sent:
                    table["columnDefinitions"] = []
                headers_sent = True
                return _event(event_type, table)

            for event_type, obj in initial:
                await response.write(encode(event_type, obj))
            if send_initial:
                await response.write(_bookmark(rt, str(self.store.resource_version), initial_end=True))
            while True:
                wait_s = self.bookmark_interval_s if deadline is None else min(self.bookmark_interval_s,
                                                                               deadline - loop.time())
                if wait_s <= 0:
                    break
                try:
                    item = await asyncio.wait_for(watch.queue.get(), wait_s)
                except TimeoutError:
                    if bookmarks and wait_s >= self.bookmark_interval_s:  # periodic, not at the watch's end
                        await response.write(_bookmark(rt, str(self.store.resource_version)))
                    continue
                if item is None:
                    break
                await response.write(encode(*item))
            await response.write_eof()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            self.store.unwatch(watch)
        return response


def _access_review(body: Any) -> dict[str, Any]:
    """A SelfSubjectAccessReview answered as kube-apiserver answers an admin's: allowed (the sandbox has no RBAC;
    the controller asks at start whether it may write where it manages)."""
    if not isinstance(body, Mapping) or not isinstance(body.get("spec"), Mapping):
        raise ApiError(422, "Invalid", "SelfSubjectAccessReview.authorization.k8s.io \"\" is invalid: spec: Required "
                                       "value")
    return {"kind": "SelfSubjectAccessReview", "apiVersion": "authorization.k8s.io/v1", "metadata": {},
            "spec": body["spec"], "status": {"allowed": True}}


def _event(event_type: str, obj: Mapping[str, Any]) -> bytes:
    return json.dumps({"type": event_type, "object": obj}, separators=(",", ":")).encode() + b"\n"


def _bookmark(rt: ResourceType, rv: str, *, initial_end: bool = False) -> bytes:
    meta: Obj = {"resourceVersion": rv}
    if initial_end:
        meta["annotations"] = {"k8s.io/initial-events-end": "true"}
    return _event("BOOKMARK", {"kind": rt.kind, "apiVersion": rt.api_version, "metadata": meta})


def _json(obj: Mapping[str, Any], status: int = 200, warnings: list[str] | None = None) -> aiohttp.web.Response:
    response = aiohttp.web.Response(body=json.dumps(obj, separators=(",", ":")).encode(), status=status,
                                    content_type="application/json")
    for warning in warnings or []:
        # Field names come from the client: escape control and non-ASCII characters (aiohttp refuses them in
        # headers, and would drop the connection instead of answering).
        text = json.dumps(warning, ensure_ascii=True)[1:-1]  # quotes become \" as in kube-apiserver's warnings
        response.headers.add("Warning", f'299 - "{text}"')
    return response


def _status(error: ApiError) -> aiohttp.web.Response:
    return _json(error.status(), error.code)


def _method_not_allowed(method: str) -> ApiError:
    return ApiError(405, "MethodNotAllowed", f"the server does not allow this method on the requested resource "
                                             f"({method})")


def _number(q: Mapping[str, str], name: str) -> float | None:
    """A numeric query parameter; a malformed one is a 400 naming it, as kube-apiserver answers."""
    raw = q.get(name)
    if raw in (None, ""):
        return None
    try:
        value = float(str(raw))
    except ValueError:
        raise bad_request(f"{name}: invalid value {raw!r}: must be a number") from None
    if value < 0:
        raise bad_request(f"{name}: invalid value {raw!r}: must not be negative")
    return value


def _field_validation(q: Mapping[str, str]) -> str:
    value = q.get("fieldValidation") or "Warn"
    if value not in ("Strict", "Warn", "Ignore"):
        raise bad_request(f"fieldValidation: invalid value {value!r}: must be Strict, Warn or Ignore")
    return value


def _dry_run(q: Mapping[str, str]) -> bool:
    value = q.get("dryRun")
    if value not in (None, "", "All"):
        raise bad_request(f"dryRun: Unsupported value: {value!r}: supported values: \"All\"")
    return value == "All"


class ApiServerSite:
    """`api` served over HTTP on 127.0.0.1 (aiohttp's `AppRunner` and `TCPSite`): `port` None picks a free port.
    `stop()` ends the watches still open (the store's) before it closes the server."""

    def __init__(self, api: SandboxApiServer, port: int | None = None, host: str = "127.0.0.1") -> None:
        self.api = api
        self.host = host
        self._port = port
        self._runner: aiohttp.web.AppRunner | None = None

    @property
    def port(self) -> int:
        if self._runner is None:
            raise RuntimeError("the API server is not serving")
        return int(self._runner.addresses[0][1])

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def start(self) -> None:
        if self._runner is not None:
            raise RuntimeError("the API server is already serving")
        # handler_cancellation: a client that goes away ends its watch at once, not at the watch's next event
        runner = aiohttp.web.AppRunner(self.api.application(), handler_cancellation=True)
        await runner.setup()
        try:
            await aiohttp.web.TCPSite(runner, self.host, self._port or 0, reuse_address=True).start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner

    async def stop(self) -> None:
        if self._runner is None:
            return
        self.api.store.close_watches()
        runner, self._runner = self._runner, None
        await runner.cleanup()
