"""Validate a custom resource against its operator's real CRD (tests/crds/), as strictly as the API
server's field validation (kubectl apply --validate=strict): unknown fields are errors at any depth.

A CRD's openAPIV3Schema leaves objects open unless it says otherwise; the API server prunes (or, strictly,
rejects) fields a structural schema does not name. So every object schema that lists `properties` gets
`additionalProperties: false`, except where the CRD itself keeps unknown fields
(`x-kubernetes-preserve-unknown-fields`) or embeds a whole resource (`x-kubernetes-embedded-resource`
without properties). Maps (`additionalProperties: {...}`, e.g. resources.limits, mpiReplicaSpecs) stay
maps. PodTemplateSpec is spelled out inside every CRD here, so a typo in a volume or a probe is caught too;
Trainer v2's runtimes also spell out the whole JobSet template (no x-kubernetes-preserve-unknown-fields
anywhere in them), so a runtime is checked down to its pods' containers.

Not checked: the CRDs' CEL rules (x-kubernetes-validations, e.g. "only one mlPolicy", immutability) and
the operators' admission webhooks; the tests assert what those rules say where it matters.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

CRDS = Path(__file__).resolve().parents[1] / "crds"
FILES = {("kubeflow.org/v1", "PyTorchJob"): "kubeflow.org_pytorchjobs.yaml",
         ("kubeflow.org/v2beta1", "MPIJob"): "kubeflow.org_mpijobs.yaml",
         ("trainer.kubeflow.org/v1alpha1", "TrainJob"): "trainer.kubeflow.org_trainjobs.yaml",
         ("trainer.kubeflow.org/v1alpha1", "ClusterTrainingRuntime"): "trainer.kubeflow.org_clustertrainingruntimes.yaml"}


def strict(schema: Any) -> Any:
    """A copy of `schema` in which objects with named properties admit no other keys."""
    if isinstance(schema, list):
        return [strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: (v if k in ("enum", "default", "example", "required") else strict(v))
           for k, v in schema.items() if k != "properties"}  # each subschema once: twice doubles per level
    if "properties" in schema:
        # property names are keys here, not schema keywords
        out["properties"] = {name: strict(sub) for name, sub in schema["properties"].items()}
        if ("additionalProperties" not in schema and not schema.get("x-kubernetes-preserve-unknown-fields")
                and schema.get("type", "object") == "object"):
            out["additionalProperties"] = False
    return out


@cache
def schema_for(api_version: str, kind: str) -> dict:
    """The strict openAPIV3Schema of `kind` at `api_version`, from the stored upstream CRD."""
    import yaml

    group, version = api_version.split("/")
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's, where built: the CRDs are ~1 MB each
    crd = yaml.load((CRDS / FILES[(api_version, kind)]).read_text(), Loader=loader)
    assert crd["spec"]["group"] == group and crd["spec"]["names"]["kind"] == kind
    found = [v for v in crd["spec"]["versions"] if v["name"] == version and v["served"]]
    assert found, f"{kind} {api_version} is not served by {FILES[(api_version, kind)]}"
    body = strict(found[0]["schema"]["openAPIV3Schema"])
    # apiVersion and kind are free strings in the CRD; pin them as the API server's routing does
    body["properties"]["apiVersion"] = {"const": api_version}
    body["properties"]["kind"] = {"const": kind}
    body["required"] = sorted({*body.get("required", []), "apiVersion", "kind", "metadata", "spec"})
    return body


def errors(obj: dict) -> list[str]:
    """Every schema violation of `obj`, one line each ("spec.x.y: message"); empty when valid."""
    import jsonschema

    validator = jsonschema.Draft7Validator(schema_for(obj.get("apiVersion", "?"), obj.get("kind", "?")))
    found = sorted(validator.iter_errors(obj), key=lambda e: list(map(str, e.absolute_path)))
    return [f"{'.'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}" for e in found]
