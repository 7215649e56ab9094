"""Log rules for Ray and Ray Serve: resource requests no node can satisfy, Serve configs that fail
validation, and workers killed by Ray's memory monitor.

Each message is Ray's own (the autoscaler's "No available node types can fulfill resource request",
pydantic's validation of the Serve schemas, the raylet's OOM killer); the rule reports the request,
the schema or the memory figures it states.

Registered into :data:`usg.doctor.logs.rules.RULES` on import (before the drift rule).
"""

from __future__ import annotations

import re
from typing import Any

from usg.doctor.logs.rule_base import Explained, R, _rule

__all__: list[str] = []


@_rule(
    "LOG049",
    "ray",
    "resource request no node can satisfy",
    R.CONFIG_INVALID,
    r"No available node types can fulfill resource requests?\s+(?P<req>(?:defaultdict\(<class 'float'>, )?\{[^}]*\}\)?)"
    r"|could not find a node type to satisfy the request: (?P<req2>\[[^\]]*\])",
)
def _infeasible(m: re.Match[str]) -> Explained:
    req = m["req"] or m["req2"]
    return Explained(
        f"Ray cannot place a task/actor/replica asking for {req}: no node (or node type the autoscaler may start) "
        "offers these resources together",
        "ask for what one node has (ray_actor_options num_cpus/num_gpus, placement group bundles), start Ray with "
        "the GPUs/CPUs declared (ray start --num-gpus, ray.init(num_gpus=...)), or add a node type with these "
        "resources (CPU and GPU counts included) to the cluster config",
        {"request": req},
    )


@_rule(
    "LOG051",
    "ray_serve",
    "Serve config fails validation",
    R.CONFIG_INVALID,
    r"(?P<n>\d+) validation errors? for (?P<schema>\w*(?:Serve|Deployment|RayActorOptions)\w*(?:Schema|Config))"
    r"|runtime_env\['(?P<field>\w+)'\] must be of type (?P<type>\w+(?:\[[^\]\n]*\])?)"
    r"|Deployment '(?P<dep>[^']+)' does not exist\. Available: (?P<avail>\[[^\]]*\])",
)
def _serve_config(m: re.Match[str]) -> Explained:
    ev: dict[str, Any]
    if m["schema"]:
        fields = re.findall(r"^\s*(\w+)\n\s+(?:field required|extra fields not permitted|value is not)", m.string, re.M)
        ev = {"schema": m["schema"], "errors": int(m["n"]), "fields": fields[:10]}
        what = f"the Serve config does not validate against {m['schema']} ({m['n']} error(s))"
        if fields:
            what += ": " + ", ".join(fields[:6])
    elif m["field"]:
        ev = {"field": f"runtime_env.{m['field']}", "expected_type": m["type"].strip()}
        what = f"runtime_env.{m['field']} must be {ev['expected_type']} (YAML turned a value into another type)"
    else:
        ev = {"deployment": m["dep"], "available": m["avail"]}
        what = f"the config names deployment {m['dep']!r}, which the application does not define ({m['avail']})"
    return Explained(
        what,
        "fix the Serve config file: field names and nesting as in the Serve config schema (single-application vs "
        "`applications:` form), deployment names as the application's code binds them, strings quoted in YAML "
        "(env_vars values must be strings)",
        ev,
    )


@_rule(
    "LOG052",
    "ray",
    "workers killed by Ray's memory monitor",
    R.MEMORY,
    r"(?P<n>\d+)?\s*Workers? \(tasks / actors\) killed due to memory pressure \(OOM\)"
    r"|(?P<n2>\d+) worker\(s\) were killed due to the node running low on memory"
    r"|Task was killed due to the node running low on memory"
    r"|ray\.exceptions\.OutOfMemoryError",
)
def _ray_oom(m: re.Match[str]) -> Explained:
    n = m["n"] or m["n2"]
    used = re.search(r"(\d+(?:\.\d+)?)\s*GB\s*(?:used\s*)?/\s*(\d+(?:\.\d+)?)\s*GB", m.string)
    ev: dict[str, Any] = {"workers_killed": int(n) if n else None}
    if used:
        ev["used_gb"], ev["limit_gb"] = float(used[1]), float(used[2])
    return Explained(
        "Ray's memory monitor killed workers because the node ran out of memory"
        + (f" ({n} killed)" if n else "")
        + (f": {ev['used_gb']:g} of {ev['limit_gb']:g} GB in use" if used else ""),
        "declare the memory each task/replica needs (ray_actor_options memory=...) so Ray packs fewer per node, "
        "lower per-replica memory (smaller batches/models), add nodes with more RAM, or keep work off the head node "
        "(--num-cpus=0 on it)",
        ev,
    )


@_rule(
    "LOG067",
    "ray",
    "runtime_env cannot be set up",
    R.CONFIG_INVALID,
    r"Failed to create runtime env: (?P<env>\{[^\n]{0,300}?\})(?:, error message: (?P<err>[^\n]{1,200}))?"
    r"|RuntimeEnvSetupError: Failed to set ?up runtime env(?:ironment)?\.?(?P<rest>[^\n]{0,200})",
)
def _runtime_env(m: re.Match[str]) -> Explained:
    env = m["env"]
    err = (m["err"] or m["rest"] or "").strip() or None
    keys = re.findall(r"[\"'](\w+)[\"']\s*:", env) if env else []
    what = "Ray cannot set up the runtime_env the deployment asks for"
    if keys:
        what += f" ({', '.join(dict.fromkeys(keys))})"
    if err:
        what += f": {err}"
    return Explained(
        what,
        "fix the runtime_env in the Serve config / ray_actor_options: working_dir and py_modules must be local "
        "paths or remote URIs Ray can fetch (https://, s3://, gs:// zip files), pip/conda entries must be "
        "installable on the cluster, keys must be runtime_env fields",
        {"runtime_env": env, "error": err, "fields": keys or None},
    )
