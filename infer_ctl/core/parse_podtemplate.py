"""Reading `spec.runtime`'s Pod template fields (`infer_ctl.core.podtemplate`) with their `Prop`s, every problem
with its path, and the CRD's CEL rules in Python (`tests/core/test_parse_agrees_with_crd_rules.py` holds the two
together), e.g.

    spec.runtime.env[0]: value and valueFrom are mutually exclusive
    spec.runtime.volumes[1]: a volume needs exactly one of secret, configMap, persistentVolumeClaim or emptyDir ...
    spec.runtime.volumeMounts[0].name: "weights" is not a volume of spec.runtime.volumes
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from infer_ctl.core import podtemplate as pt
from infer_ctl.core.fields import FieldReader, Prop, type_name
from infer_ctl.core.podtemplate_schema import VALUE_FROM_SOURCES
from infer_ctl.core.quantity import parse_bytes, parse_quantity


def items(r: FieldReader, parent: Mapping[str, Any], schema: Prop, key: str,
          path: str) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """The objects of the list `key` (whose `Prop` is `schema[key]`) with their paths: the list's type, length,
    each item an object without unknown fields, and a map list's keys unique, checked as kube-apiserver does."""
    prop, where = schema[key], f"{path}.{key}"
    raw = parent.get(key)
    if raw is None:
        return
    if not isinstance(raw, list):
        r.error(where, f"must be a list, got {type_name(raw)}", "FieldValueTypeInvalid")
        return
    if prop.max_items is not None and len(raw) > prop.max_items:
        r.error(where, f"must have at most {prop.max_items} items", "FieldValueTooMany")
        return
    assert prop.items is not None
    seen: set[tuple[Any, ...]] = set()
    for i, item in enumerate(raw):
        ip = f"{where}[{i}]"
        if not isinstance(item, Mapping):
            r.error(ip, f"must be an object, got {type_name(item)}", "FieldValueTypeInvalid")
            continue
        r.unknown(item, ip, prop.items.keys)
        if prop.list_type == "map":
            ident = tuple(str(item.get(k)) for k in prop.list_map_keys)
            if ident in seen:
                shown = ", ".join(f'{k}="{item.get(k)}"' for k in prop.list_map_keys)
                r.error(ip, f"Duplicate value: map[{shown}]", "FieldValueDuplicate")
                continue
            seen.add(ident)
        yield ip, item


def _count(obj: Mapping[str, Any], keys: tuple[str, ...]) -> int:
    return sum(obj.get(k) is not None for k in keys)


def _key_ref(r: FieldReader, source: Mapping[str, Any], schema: Prop, key: str, path: str) -> pt.KeyRef | None:
    ref = r.sub(source, schema, key, path)
    if source.get(key) is None:
        return None
    p, s = f"{path}.{key}", schema[key]
    name, k = r.read(ref, s, "name", p, what="a DNS subdomain"), r.read(ref, s, "key", p, what="a valid key")
    optional = r.read(ref, s, "optional", p)
    return pt.KeyRef(name, k, bool(optional)) if name is not None and k is not None else None


def parse_env(r: FieldReader, rt: Mapping[str, Any], runtime: Prop, path: str) -> list[tuple[str, str,
                                                                                              pt.EnvVarSource | None]]:
    """`env`: (name, value, valueFrom) for each variable."""
    item_schema = runtime["env"].items
    assert item_schema is not None
    out: list[tuple[str, str, pt.EnvVarSource | None]] = []
    for ip, item in items(r, rt, runtime, "env", path):
        name = r.read(item, item_schema, "name", ip, what="a valid environment variable name")
        value = r.read(item, item_schema, "value", ip)
        source = None
        if item.get("valueFrom") is not None:
            if item.get("value") is not None:
                r.error(ip, "value and valueFrom are mutually exclusive")
            source = _value_from(r, item, item_schema, ip)
        if name is not None:
            out.append((name, value or "", source))
    return out


def _value_from(r: FieldReader, item: Mapping[str, Any], item_schema: Prop, ip: str) -> pt.EnvVarSource | None:
    schema, p = item_schema["valueFrom"], f"{ip}.valueFrom"
    vf = r.sub(item, item_schema, "valueFrom", ip)
    if not vf:
        if isinstance(item.get("valueFrom"), Mapping):
            r.error(p, "exactly one of secretKeyRef, configMapKeyRef, fieldRef or resourceFieldRef is required")
        return None
    if _count(vf, VALUE_FROM_SOURCES) != 1:
        r.error(p, "exactly one of secretKeyRef, configMapKeyRef, fieldRef or resourceFieldRef is required")
    secret = _key_ref(r, vf, schema, "secretKeyRef", p)
    config = _key_ref(r, vf, schema, "configMapKeyRef", p)
    field_ref = r.sub(vf, schema, "fieldRef", p)
    field_path = None
    if vf.get("fieldRef") is not None:
        field_path = r.read(field_ref, schema["fieldRef"], "fieldPath", f"{p}.fieldRef",
                            what="a field kubelet can expose")
    resource_ref = r.sub(vf, schema, "resourceFieldRef", p)
    resource = divisor = None
    if vf.get("resourceFieldRef") is not None:
        rp, rs = f"{p}.resourceFieldRef", schema["resourceFieldRef"]
        if resource_ref.get("resource") is None:  # `read` takes an enum's absence for its default
            r.error(f"{rp}.resource", "Required value", "FieldValueRequired")
        resource = r.read(resource_ref, rs, "resource", rp)
        divisor = r.read_parsed(resource_ref, rs, "divisor", rp, _positive_quantity)
        divisor = resource_ref.get("divisor") if divisor is not None else None
    if secret is None and config is None and field_path is None and resource is None:
        return None
    return pt.EnvVarSource(secret_key_ref=secret, config_map_key_ref=config, field_path=field_path,
                           resource=resource, divisor=divisor)


def _positive_quantity(text: str) -> str:
    if parse_quantity(text) <= 0:
        raise ValueError(f"{text!r}: must be a positive quantity")
    return text


def parse_env_from(r: FieldReader, rt: Mapping[str, Any], runtime: Prop, path: str) -> tuple[pt.EnvFromSource, ...]:
    schema = runtime["envFrom"].items
    assert schema is not None
    out = []
    for ip, item in items(r, rt, runtime, "envFrom", path):
        if _count(item, ("secretRef", "configMapRef")) != 1:
            r.error(ip, "exactly one of secretRef or configMapRef is required")
        prefix = r.read(item, schema, "prefix", ip, what="a valid environment variable name prefix")
        for key in ("secretRef", "configMapRef"):
            ref = r.sub(item, schema, key, ip)
            if item.get(key) is None:
                continue
            name = r.read(ref, schema[key], "name", f"{ip}.{key}", what="a DNS subdomain")
            optional = r.read(ref, schema[key], "optional", f"{ip}.{key}")
            if name is not None:
                out.append(pt.EnvFromSource(name, key == "secretRef", bool(optional), prefix or ""))
    return tuple(out)


def parse_volumes(r: FieldReader, rt: Mapping[str, Any], runtime: Prop, path: str) -> tuple[pt.Volume, ...]:
    schema = runtime["volumes"].items
    assert schema is not None
    out = []
    types = tuple(t.value for t in pt.VolumeType)
    for ip, item in items(r, rt, runtime, "volumes", path):
        name = r.read(item, schema, "name", ip, what="a DNS label")
        if name in pt.RESERVED_VOLUMES:
            r.error(f"{ip}.name", f"the volume names {pt.MODEL_CACHE_VOLUME} and {pt.SHM_VOLUME} are the "
                                  "controller's own (the node's model cache and /dev/shm)")
        if _count(item, types) != 1:
            r.error(ip, "a volume needs exactly one of secret, configMap, persistentVolumeClaim or emptyDir (other "
                        "volume types are not supported)")
        volume = None
        for kind in pt.VolumeType:
            body = r.sub(item, schema, kind.value, ip)
            if item.get(kind.value) is None:
                continue
            volume = _volume(r, name or "", kind, body, schema=schema[kind.value], path=f"{ip}.{kind.value}")
        if name is not None and volume is not None:
            out.append(volume)
    return tuple(out)


def _volume(r: FieldReader, name: str, kind: pt.VolumeType, body: Mapping[str, Any], *, schema: Prop,
            path: str) -> pt.Volume | None:
    if kind is pt.VolumeType.EMPTY_DIR:
        limit = r.read_parsed(body, schema, "sizeLimit", path, _non_negative_quantity)
        return pt.Volume(name, kind, medium=r.read(body, schema, "medium", path),
                         size_limit=body.get("sizeLimit") if limit is not None else None)
    source_key = {pt.VolumeType.SECRET: "secretName", pt.VolumeType.CONFIG_MAP: "name",
                  pt.VolumeType.PERSISTENT_VOLUME_CLAIM: "claimName"}[kind]
    source = r.read(body, schema, source_key, path, what="a DNS subdomain")
    if kind is pt.VolumeType.PERSISTENT_VOLUME_CLAIM:
        read_only = r.read(body, schema, "readOnly", path)
        return None if source is None else pt.Volume(name, kind, source, read_only=bool(read_only))
    optional = r.read(body, schema, "optional", path)
    mode = r.read(body, schema, "defaultMode", path)
    return None if source is None else pt.Volume(name, kind, source, optional=bool(optional), default_mode=mode)


def _non_negative_quantity(text: str) -> str:
    if parse_quantity(text) < 0:
        raise ValueError(f"{text!r}: must not be negative")
    return text


def parse_volume_mounts(r: FieldReader, rt: Mapping[str, Any], runtime: Prop, path: str) -> tuple[pt.VolumeMount, ...]:
    """`volumeMounts`, each naming a volume the manifest declares (one refused for its own problem counts)."""
    schema = runtime["volumeMounts"].items
    assert schema is not None
    declared = {str(v.get("name")) for v in rt.get("volumes") or () if isinstance(v, Mapping)} \
        if isinstance(rt.get("volumes"), list) else set()
    out = []
    for ip, item in items(r, rt, runtime, "volumeMounts", path):
        name = r.read(item, schema, "name", ip, what="a DNS label")
        mount_path = r.read(item, schema, "mountPath", ip, what="an absolute path (starting with '/')")
        if name is not None and name not in declared:
            r.error(f"{ip}.name", f'"{name}" is not a volume of {path}.volumes: every volumeMount must name a '
                                  "volume of volumes")
        if mount_path is not None and (mount_path == pt.SHM_PATH or mount_path.startswith(pt.SHM_PATH + "/")):
            r.error(f"{ip}.mountPath", f"{pt.SHM_PATH} is the controller's (sized by shmSize)")
        read_only = r.read(item, schema, "readOnly", ip)
        sub_path = r.read(item, schema, "subPath", ip, what="a relative path without '..'")
        if name is not None and mount_path is not None:
            out.append(pt.VolumeMount(name, mount_path, bool(read_only), sub_path or ""))
    return tuple(out)


def parse_tolerations(r: FieldReader, rt: Mapping[str, Any], runtime: Prop, path: str) -> tuple[pt.Toleration, ...]:
    schema = runtime["tolerations"].items
    assert schema is not None
    out = []
    for ip, item in items(r, rt, runtime, "tolerations", path):
        key = r.read(item, schema, "key", ip, what="a label key")
        operator = r.read(item, schema, "operator", ip)
        value = r.read(item, schema, "value", ip)
        effect = r.read(item, schema, "effect", ip)
        seconds = r.read(item, schema, "tolerationSeconds", ip)
        if operator is pt.TolerationOperator.EXISTS and item.get("value") is not None:
            r.error(ip, "value must be empty with operator Exists")
        if item.get("key") is None and operator is not pt.TolerationOperator.EXISTS:
            r.error(ip, "an empty key (every taint) needs operator Exists")
        if item.get("tolerationSeconds") is not None and effect is not pt.TaintEffect.NO_EXECUTE:
            r.error(ip, "tolerationSeconds needs effect NoExecute")
        out.append(pt.Toleration(key or "", operator, value or "", effect, seconds))
    return tuple(out)


def _requirements(r: FieldReader, parent: Mapping[str, Any], schema: Prop, key: str,
                  path: str) -> tuple[pt.NodeRequirement, ...]:
    item_schema = schema[key].items
    assert item_schema is not None
    out = []
    for ip, item in items(r, parent, schema, key, path):
        label = r.read(item, item_schema, "key", ip, what="a label key")
        operator = r.read(item, item_schema, "operator", ip)
        if item.get("operator") is None:
            r.error(f"{ip}.operator", "Required value", "FieldValueRequired")
        values = r.read(item, item_schema, "values", ip)
        problem = _values_problem(operator, values)
        if problem:
            r.error(ip, problem)
        if label is not None and operator is not None:
            out.append(pt.NodeRequirement(label, operator, tuple(values)))
    return tuple(out)


def _values_problem(operator: pt.SelectorOperator | None, values: tuple[str, ...]) -> str:
    message = ("values: at least one with In and NotIn, none with Exists and DoesNotExist, exactly one (an "
               "integer) with Gt and Lt")
    if operator in (pt.SelectorOperator.IN, pt.SelectorOperator.NOT_IN):
        return "" if values else message
    if operator in (pt.SelectorOperator.EXISTS, pt.SelectorOperator.DOES_NOT_EXIST):
        return "" if not values else message
    if operator is not None:
        return "" if len(values) == 1 else message
    return ""


def parse_node_affinity(r: FieldReader, rt: Mapping[str, Any], runtime: Prop, path: str
                        ) -> tuple[tuple[pt.NodeRequirement, ...], tuple[pt.PreferredTerm, ...]]:
    schema, p = runtime["nodeAffinity"], f"{path}.nodeAffinity"
    affinity = r.sub(rt, runtime, "nodeAffinity", path)
    required = _requirements(r, affinity, schema, "required", p)
    preferred = []
    term_schema = schema["preferred"].items
    assert term_schema is not None
    for ip, term in items(r, affinity, schema, "preferred", p):
        weight = r.read(term, term_schema, "weight", ip)
        if term.get("matchExpressions") is None:
            r.error(f"{ip}.matchExpressions", "Required value", "FieldValueRequired")
        expressions = _requirements(r, term, term_schema, "matchExpressions", ip)
        if weight is not None:
            preferred.append(pt.PreferredTerm(weight, expressions))
    return required, tuple(preferred)


def parse_probes(r: FieldReader, rt: Mapping[str, Any], runtime: Prop, path: str) -> pt.Probes:
    schema, p = runtime["probes"], f"{path}.probes"
    probes = r.sub(rt, runtime, "probes", path)

    def timing(kind: str) -> pt.ProbeTiming:
        body, s, kp = r.sub(probes, schema, kind, p), schema[kind], f"{p}.{kind}"
        return pt.ProbeTiming(period_s=r.read(body, s, "periodSeconds", kp),
                              timeout_s=r.read(body, s, "timeoutSeconds", kp),
                              failure_threshold=r.read(body, s, "failureThreshold", kp),
                              initial_delay_s=r.read(body, s, "initialDelaySeconds", kp))

    liveness = r.sub(probes, schema, "liveness", p)
    enabled = r.read(liveness, schema["liveness"], "enabled", f"{p}.liveness")
    return pt.Probes(startup=timing("startup"), readiness=timing("readiness"), liveness=timing("liveness"),
                     liveness_enabled=bool(enabled))


def parse_pre_stop(r: FieldReader, rt: Mapping[str, Any], runtime: Prop, path: str) -> pt.PreStop | None:
    schema, p = runtime["preStop"], f"{path}.preStop"
    hook = r.sub(rt, runtime, "preStop", path)
    if rt.get("preStop") is None:
        return None
    if _count(hook, ("sleep", "exec", "httpGet")) != 1:
        r.error(p, "exactly one of sleep, exec or httpGet is required")
    sleep, run, get = (r.sub(hook, schema, k, p) for k in ("sleep", "exec", "httpGet"))
    seconds = r.read(sleep, schema["sleep"], "seconds", f"{p}.sleep") if hook.get("sleep") is not None else None
    command: tuple[str, ...] = ()
    if hook.get("exec") is not None:
        command = r.read(run, schema["exec"], "command", f"{p}.exec")
        if run.get("command") is None:
            r.error(f"{p}.exec.command", "Required value", "FieldValueRequired")
    http_path = port = None
    if hook.get("httpGet") is not None:
        http_path = r.read(get, schema["httpGet"], "path", f"{p}.httpGet",
                           what="an absolute path (starting with '/')")
        port = r.read(get, schema["httpGet"], "port", f"{p}.httpGet")
    return pt.PreStop(sleep_s=seconds, command=tuple(command), http_path=http_path, http_port=port)


def parse_image_pull_secrets(r: FieldReader, rt: Mapping[str, Any], runtime: Prop, path: str) -> tuple[str, ...]:
    schema = runtime["imagePullSecrets"].items
    assert schema is not None
    names = (r.read(item, schema, "name", ip, what="a DNS subdomain")
             for ip, item in items(r, rt, runtime, "imagePullSecrets", path))
    return tuple(n for n in names if n is not None)


def parse_limits(r: FieldReader, rt: Mapping[str, Any], runtime: Prop, path: str, *,
                 millicores: Callable[[str], int]) -> tuple[int, int]:
    """`limits`: (cpu millicores, memory bytes), 0 where unset."""
    limits = r.sub(rt, runtime, "limits", path)
    cpu = r.read_parsed(limits, runtime["limits"], "cpu", f"{path}.limits", millicores)
    memory = r.read_parsed(limits, runtime["limits"], "memory", f"{path}.limits", _bytes)
    return cpu or 0, memory or 0


def _bytes(text: str) -> int:
    if text[:1] in "+-":
        raise ValueError(f"{text!r}: write the size without a sign")
    return parse_bytes(text)


def check_across(r: FieldReader, rt: Mapping[str, Any], path: str, *, pre_stop: pt.PreStop | None,
                 grace_s: int | None) -> None:
    """The runtime's CEL rules across fields (`podtemplate.POD_TEMPLATE_RULES`), in Python with the numbers."""
    raw = rt.get("limits")
    limits: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
    for key in ("cpu", "memory"):
        request, limit = _quantity_or_none(rt.get(key)), _quantity_or_none(limits.get(key))
        if request is not None and limit is not None and limit < request:
            r.error(f"{path}.limits.{key}", f"limits.{key} must not be below {key} ({rt.get(key)}), got "
                                            f"{limits.get(key)}")
    grace = pt.DEFAULT_GRACE_S if grace_s is None else grace_s
    if pre_stop is not None and pre_stop.sleep_s is not None and pre_stop.sleep_s > grace:
        r.error(f"{path}.preStop.sleep.seconds", f"preStop.sleep.seconds must not exceed "
                                                 f"terminationGracePeriodSeconds ({grace}), got {pre_stop.sleep_s}")


def _quantity_or_none(value: Any) -> Any:
    """A quantity's exact value, None when it is absent or no quantity (reported where it is read)."""
    if not isinstance(value, str):
        return None
    try:
        return parse_quantity(value)
    except ValueError:
        return None
