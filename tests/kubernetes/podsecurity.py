"""The "restricted" Pod Security Standard, as the namespaces enforce it (the rules that apply
to the pods sandcell makes and deploys)."""

from __future__ import annotations

from typing import Any

VOLUME_KINDS = {
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
}


def restricted_violations(spec: dict[str, Any]) -> list[str]:
    found = [f for f in ("hostNetwork", "hostPID", "hostIPC") if spec.get(f)]
    for volume in spec.get("volumes", []):
        if not set(volume) - {"name"} <= VOLUME_KINDS:
            found.append(f"volume {volume['name']} of a forbidden kind")
    pod = spec.get("securityContext", {})
    for c in [*spec.get("initContainers", []), *spec["containers"]]:
        sc = c.get("securityContext", {})
        caps = sc.get("capabilities", {})
        checks = {
            "privileged": not sc.get("privileged"),
            "allowPrivilegeEscalation": sc.get("allowPrivilegeEscalation") is False,
            "capabilities.drop ALL": "ALL" in caps.get("drop", []),
            "capabilities.add": set(caps.get("add", [])) <= {"NET_BIND_SERVICE"},
            "runAsNonRoot": bool(sc.get("runAsNonRoot", pod.get("runAsNonRoot"))),
            "runAsUser 0": sc.get("runAsUser", pod.get("runAsUser")) != 0,
            "seccompProfile": sc.get("seccompProfile", pod.get("seccompProfile", {})).get("type")
            in ("RuntimeDefault", "Localhost"),
            "hostPort": not any(p.get("hostPort") for p in c.get("ports", [])),
        }
        found += [f"{c['name']}: {rule}" for rule, ok in checks.items() if not ok]
    return found
