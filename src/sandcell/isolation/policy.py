"""What a cell must enforce: the template's limits and which layers may degrade."""

from __future__ import annotations

from dataclasses import dataclass, field

from sandcell.cellapi.environment import DEFAULT_INHERIT

# Every layer a host may be unable to enforce; a template lists the ones it lets degrade.
LAYERS = ("namespaces", "seccomp", "landlock", "cgroups", "disk_quota")


class IsolationUnavailable(Exception):
    """A required layer cannot be enforced on this host: creation fails (fail closed)."""

    def __init__(self, layer: str, detail: str) -> None:
        super().__init__(f"{layer}: {detail}")
        self.layer = layer
        self.detail = detail


@dataclass(frozen=True)
class CellPolicy:
    memory_mb: int = 512
    cpus: float = 1.0
    pids_max: int = 256
    disk_mb: int = 1024
    network: str = "none"  # "none" | "loopback": a private netns with loopback only, either way
    nofile: int = 1024
    inherit_env: tuple[str, ...] = DEFAULT_INHERIT
    allow_degraded: frozenset[str] = field(default_factory=frozenset)
    code_python: str | None = None  # python code contexts' interpreter (default: the daemon's)
    # A built image's root on the host (SPEC §12), and the env its config asks for;
    # None: the host's system dirs.
    image_root: str | None = None
    image_env: tuple[tuple[str, str], ...] = ()
    pod_image: str | None = None  # Kubernetes: the pod's image (`image.oci`)
    # A host directory holding the sandbox's CA bundle (SPEC §17), bound read-only at
    # network.tls.authority.CELL_CA_DIR; None: the sandbox has no secrets.
    ca_dir: str | None = None

    def __post_init__(self) -> None:
        if self.network not in ("none", "loopback"):
            raise ValueError(f"network must be 'none' or 'loopback', not {self.network!r}")
        unknown = set(self.allow_degraded) - set(LAYERS)
        if unknown:
            raise ValueError(f"unknown layers in allow_degraded: {sorted(unknown)}")

    def require(self, layer: str, available: bool, detail: str) -> bool:
        """True when the layer is to be enforced; raises when it is needed but missing."""
        if available:
            return True
        if layer in self.allow_degraded:
            return False
        raise IsolationUnavailable(layer, detail)
