"""The sandbox's Kubernetes API server: kmock's HTTP server and discovery over the sandbox `Store`.

What comes from kmock 0.8 (by kopf's author), through its public names only (`kmock.Server`,
`kmock.KubernetesScaffold`, `kmock.Request`, `kmock.resource`, `kmock.action`, `kmock.KubernetesError`): the aiohttp
server, API discovery (`/api`, `/apis`, `/apis/GROUP/VERSION`, fed from the store's resource types, so CRDs appear
when applied), and its request-reaction DSL: user reactions take priority over the store, which is how tests inject
faults (`server['patch /api/v1/namespaces/ns/pods/p'] << 500`).

What is written here, and why:
- `__call__`: kmock's request parser fails on `/api/v1/namespaces` (500) and records every request in memory,
  which a long-running sandbox cannot afford; the path is parsed here (`parse_api_path`), the Kubernetes verb that
  reaction criteria match on is named here (`api_action`), and recording is opt-in.
- `_serve`: kmock's `KubernetesEmulator` CRUD lacks the semantics listed in `store.py`; every resource request
  that no user reaction answers is served from the `Store`, with kube-apiserver's status codes (201 on create,
  202 on deferred deletion, 409, 410, 415, 422 with causes, as `Status` bodies rendered here) and a watch that
  honours `resourceVersion`, `timeoutSeconds` and bookmarks, and ends when the server stops (kmock's watch never
  ends).
Still tied to kmock's internals, though not imported: the scaffold's underscored methods this class overrides or
calls (`_handle`, `_serve_root`, `_serve_api`, `_serve_apis`, `_serve_group`, `_serve_version`), its request log
and reaction list (`_requests`, `_payloads`) and `Request._raw_request`.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import re
from collections.abc import Mapping
from typing import Any

import aiohttp.web
import attrs
import kmock
import yaml

from infer_ctl.sandbox import tables
from infer_ctl.sandbox.resources import ResourceType
from infer_ctl.sandbox.selectors import SelectorError, parse_field_selector, parse_label_selector
from infer_ctl.sandbox.store import ApiError, Gone, Obj, Store, bad_request, delete_returns_object, details

log = logging.getLogger(__name__)

_JSON_TYPES = ("application/json", "application/json-patch+json", "application/merge-patch+json",
               "application/strategic-merge-patch+json")


class _ServeFromStore(Exception):
    """Raised by the fallback reaction so that `_handle` serves the request from the store."""


@attrs.frozen
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

    `/api/v1/namespaces` and `/api/v1/namespaces/NAME[/status|finalize]` name the namespaces resource itself (kmock's
    own parser, which this replaces, took them for a namespace's scope and answered 500).
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


def api_action(path: ApiPath, method: str, query: Mapping[str, str]) -> kmock.action | None:
    """The Kubernetes verb of a request, as kmock's reaction criteria match it (`server['list pods']`): watch,
    list, create, fetch (get), update (patch) or delete; None for the rest and for a path that is not a resource's."""
    if path.group is None:
        return None
    if method == "GET" and query.get("watch") == "true":
        return kmock.action.WATCH
    verbs = ({"GET": kmock.action.LIST, "POST": kmock.action.CREATE} if path.name is None else
             {"GET": kmock.action.FETCH, "PATCH": kmock.action.UPDATE, "DELETE": kmock.action.DELETE})
    return verbs.get(method.upper())


def _prepared_response(error: Exception) -> aiohttp.web.StreamResponse | None:
    """The response a failed streaming reaction had already started (kmock wraps the reaction's error with it):
    its headers are sent, so it is ended as it is rather than answered anew with a 500."""
    response = error.args[0] if error.args else None
    return response if isinstance(response, aiohttp.web.StreamResponse) and response.prepared else None


@attrs.define(kw_only=True)
class SandboxApiServer(kmock.KubernetesScaffold):
    """A kmock handler whose Kubernetes resources live in a `Store`. Serve it with `kmock.Server(handler)`."""

    store: Store = attrs.field(factory=Store)
    record_requests: bool = False
    bookmark_interval_s: float = 60.0
    _builtin_reactions: int = attrs.field(default=0, init=False)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self.fallback[re.compile(r"/api/v1/.+")] << self._route_to_store
        self.fallback[re.compile(r"/apis/[^/]+/[^/]+/.+")] << self._route_to_store
        self.fallback["get /version"] ** 1 << self._serve_kube_version
        self.store.on_types_changed(self._sync_discovery)
        self._sync_discovery()
        self._builtin_reactions = len(self._payloads)

    def _sync_discovery(self) -> None:
        self.resources.clear()
        for rt in self.store.types():
            self.resources[kmock.resource(group=rt.group, version=rt.version, plural=rt.plural)] = kmock.ResourceInfo(
                kind=rt.kind, namespaced=rt.namespaced, singular=rt.singular, verbs=set(rt.verbs),
                shortnames=set(rt.short_names), categories=set(rt.categories), subresources=set(rt.subresources))

    async def _serve_version(self, request: kmock.Request) -> Any:
        payload: Any = await super()._serve_version(request)
        if payload.get("groupVersion", "").startswith("/"):  # kmock writes "/v1" for the core group
            payload["groupVersion"] = payload["groupVersion"][1:]
        return payload

    def _openapi_v3_root(self) -> dict[str, Any]:
        """`/openapi/v3`: one document per group-version, as kube-apiserver lists them."""
        paths = {}
        for gv in sorted({(rt.group, rt.version) for rt in self.store.types()}):
            prefix = f"apis/{gv[0]}/{gv[1]}" if gv[0] else f"api/{gv[1]}"
            paths[prefix] = {"serverRelativeURL": f"/openapi/v3/{prefix}?hash={self.store.resource_version}"}
        return {"paths": paths}

    def _openapi_v3_group(self, group: str, version: str) -> dict[str, Any]:
        """A minimal OpenAPI 3 document of one group-version: enough for kubectl to see, per kind, that PATCH
        takes `fieldValidation` (so it validates on the server, which this server does, with the 1.37 schemas,
        instead of downloading OpenAPI v2 schemas to validate on the client)."""
        query = [{"name": name, "in": "query", "schema": {"type": "string"}, "uniqueItems": True}
                 for name in ("dryRun", "fieldManager", "fieldValidation", "force")]
        paths: dict[str, Any] = {}
        for rt in self.store.types():
            if (rt.group, rt.version) != (group, version):
                continue
            base = f"/apis/{group}/{version}" if group else f"/api/{version}"
            scope = "/namespaces/{namespace}" if rt.namespaced else ""
            gvk = {"group": group, "version": version, "kind": rt.kind}
            ok = {"200": {"description": "OK"}}
            paths[f"{base}{scope}/{rt.plural}/{{name}}"] = {
                "get": {"x-kubernetes-group-version-kind": gvk, "x-kubernetes-action": "get", "responses": ok},
                "patch": {"x-kubernetes-group-version-kind": gvk, "x-kubernetes-action": "patch",
                          "parameters": query, "responses": ok},
            }
            paths[f"{base}{scope}/{rt.plural}"] = {
                "post": {"x-kubernetes-group-version-kind": gvk, "x-kubernetes-action": "post",
                         "parameters": query, "responses": ok},
            }
        return {"openapi": "3.0.0", "info": {"title": "Kubernetes (infer-ctl sandbox)", "version": "v1.37.0"},
                "paths": paths, "components": {"schemas": {}}}

    async def _serve_kube_version(self) -> dict[str, str]:
        return {"major": "1", "minor": "37", "gitVersion": "v1.37.0-infer-ctl-sandbox", "gitTreeState": "clean",
                "goVersion": "n/a", "compiler": "python", "platform": "linux/amd64"}

    async def _route_to_store(self) -> None:
        raise _ServeFromStore

    async def __call__(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        try:
            body = await raw_request.read()
            k8s = parse_api_path(raw_request.path)
            data: Any = None
            if body and raw_request.content_type in _JSON_TYPES:
                try:
                    data = json.loads(body)
                except ValueError:
                    data = None
            request = kmock.Request(
                id=len(self._requests), raw_request=raw_request, url=raw_request.url, method=raw_request.method,
                params=dict(raw_request.query), headers=dict(raw_request.headers), data=data, body=body,
                action=api_action(k8s, raw_request.method, raw_request.query),
                resource=None if k8s.group is None else kmock.resource(group=k8s.group, version=k8s.version,
                                                                              plural=k8s.plural),
                namespace=k8s.namespace, name=k8s.name, subresource=k8s.subresource)
            if len(self._payloads) > self._builtin_reactions or self.record_requests:
                # kmock's views match a request by finding it among the recorded ones, so user reactions
                # (fault injection in tests) need recording; without them the server records nothing.
                self._requests.append(request)
                return await self._handle(request)
            return await self._direct(request)
        except Exception as e:
            if (response := _prepared_response(e)) is not None:
                log.warning("stream failed: %r", e.__cause__)
                return response
            log.exception("internal error serving %s %s", raw_request.method, raw_request.path)
            return _status(ApiError(500, "InternalError", f"an error on the server has prevented the request "
                                                          f"from succeeding: {e!r}"))

    async def _handle(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        try:
            response: aiohttp.web.StreamResponse = await super()._handle(request)
            return response
        except _ServeFromStore:
            return await self._direct(request)

    async def _direct(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        """Serve without kmock's reaction matching: resources from the store, discovery from kmock's methods."""
        raw = request._raw_request
        assert raw is not None
        path = raw.path.rstrip("/") or "/"
        try:
            if request.resource is not None and request.resource.plural is not None:
                return await self._serve(request)
            if raw.method != "GET":
                raise _method_not_allowed(raw.method)
            payload: Any
            if path == "/":
                payload = await self._serve_root(request)
            elif path == "/version":
                payload = await self._serve_kube_version()
            elif path == "/api":
                payload = await self._serve_api(request)
            elif path == "/apis":
                payload = await self._serve_apis(request)
            elif path == "/openapi/v3":
                payload = self._openapi_v3_root()
            elif match := re.fullmatch(r"/openapi/v3/apis/([^/]+)/([^/]+)|/openapi/v3/api/([^/]+)", path):
                group, version = (match.group(1), match.group(2)) if match.group(1) else ("", match.group(3))
                payload = self._openapi_v3_group(group, version)
            elif match := re.fullmatch(r"/apis/([^/]+)", path):
                request = attrs.evolve(request, resource=kmock.resource(group=match.group(1)))
                payload = await self._serve_group(request)
            elif request.resource is not None:
                payload = await self._serve_version(request)
            else:
                raise ApiError(404, "NotFound", f"the server could not find the requested resource ({path})")
            return _json(payload)
        except ApiError as e:
            return _status(e)
        except kmock.KubernetesError as e:
            return _status(ApiError(e.status, e.reason or "NotFound", e.message or ""))

    # ----------------------------------------------------------------------------------------- serving

    async def _serve(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        raw = request._raw_request
        assert raw is not None
        k8s = parse_api_path(raw.path)
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

    async def _serve_patch(self, request: kmock.Request, rt: ResourceType, ns: str | None, name: str,
                           subresource: str | None) -> aiohttp.web.StreamResponse:
        raw = request._raw_request
        assert raw is not None
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

    async def _serve_subresource(self, request: kmock.Request, rt: ResourceType, ns: str | None, name: str,
                                 subresource: str) -> aiohttp.web.StreamResponse:
        raw = request._raw_request
        assert raw is not None
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

    def _serve_scale(self, request: kmock.Request, rt: ResourceType, ns: str | None, name: str,
                     method: str) -> aiohttp.web.StreamResponse:
        """GET, PUT or PATCH of the scale subresource."""
        if method == "GET":
            return _json(self.store.scale_of(rt, self.store.get(rt, ns, name)))
        if method == "PUT":
            return _json(self.store.update_scale(rt, ns, name, self._body(request), check_rv=True))
        from infer_ctl.sandbox import patch as patching

        raw = request._raw_request
        assert raw is not None
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

    def _body(self, request: kmock.Request, *, yaml_ok: bool = False) -> Any:
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
            fields = parse_field_selector(q.get("fieldSelector"), rt.kind)
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

    def _delete_options(self, request: kmock.Request) -> dict[str, Any]:
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
            fields = parse_field_selector(q.get("fieldSelector"), rt.kind)
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
