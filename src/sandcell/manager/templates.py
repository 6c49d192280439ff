"""Templates from the server's TOML config (SPEC §4), validated with clear errors."""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from sandcell.cellapi.environment import DEFAULT_INHERIT
from sandcell.errors import ErrorCode, ServiceError
from sandcell.isolation.images.spec import ImageSpec
from sandcell.isolation.policy import LAYERS, CellPolicy
from sandcell.network.policy import MODES, Mode, NetworkPolicy, parse_policy, within_cap

DEFAULT_TEMPLATE = "default"
RESOURCES = ("cpus", "memory_mb", "disk_mb")
CODE_INTERPRETER = "code-interpreter"


class ConfigError(Exception):
    """The configuration file is unreadable or invalid; the message says where."""


class Template(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = DEFAULT_TEMPLATE
    memory_mb: int = Field(512, ge=16, le=1_048_576)
    cpus: float = Field(1.0, gt=0, le=1024)
    pids_max: int = Field(256, ge=8, le=4_194_304)
    disk_mb: int = Field(1024, ge=16, le=16_777_216)
    # The egress policy a sandbox gets by default (SPEC §11), and the widest a request may ask.
    network: Mode = "none"
    network_allow: tuple[str, ...] = ()
    network_deny: tuple[str, ...] = ()
    network_max: Mode = "allowlist"
    # Whether a request's allow entries may name loopback, private or link-local addresses.
    network_internal: bool = False
    idle_timeout_s: int = Field(300, ge=1, le=604_800)
    max_lifetime_s: int = Field(3600, ge=1, le=2_592_000)
    paused_ttl_s: int = Field(604_800, ge=1, le=31_536_000)  # a paused sandbox, then deleted
    # The most a create's `resources` may ask for (SPEC §13); unset: the defaults above.
    max_cpus: float | None = Field(None, gt=0, le=1024)
    max_memory_mb: int | None = Field(None, ge=16, le=1_048_576)
    max_disk_mb: int | None = Field(None, ge=16, le=16_777_216)
    warm_pool: int = Field(2, ge=0, le=1000)
    inherit_env: tuple[str, ...] = DEFAULT_INHERIT
    allow_degraded: tuple[str, ...] = ()
    # The interpreter of python code contexts (SPEC §10), a path inside the sandbox that has
    # IPython; unset: the python the daemon runs on (sandcell's, with its `interpreter` extra).
    code_python: str | None = Field(None, pattern=r"^/[^\x00\n]*$")
    image: ImageSpec = ImageSpec()

    @field_validator("allow_degraded")
    @classmethod
    def _known_layers(cls, layers: tuple[str, ...]) -> tuple[str, ...]:
        unknown = sorted(set(layers) - set(LAYERS))
        if unknown:
            raise ValueError(f"unknown layers {unknown}; known: {list(LAYERS)}")
        return layers

    @field_validator("network", mode="before")
    @classmethod
    def _loopback_is_none(cls, value: Any) -> Any:
        """Before egress policies, "loopback" meant what "none" means now: still accepted."""
        return "none" if value == "loopback" else value

    @model_validator(mode="after")
    def _valid_network(self) -> Template:
        policy = self.egress_policy()  # a malformed entry is a config error at start-up
        if MODES.index(policy.egress) > MODES.index(self.network_max):
            raise ValueError(f"network {self.network!r} is wider than network_max")
        return self

    def egress_policy(self) -> NetworkPolicy:
        raw = {
            "egress": self.network,
            "allow": list(self.network_allow),
            "deny": list(self.network_deny),
        }
        try:
            return parse_policy(raw)
        except ServiceError as exc:
            raise ValueError(exc.message) from None

    def network_policy(self, requested: Any) -> NetworkPolicy:
        """The policy for a new sandbox or a live change: the request's, within this
        template's cap (403 beyond), or the template's default when none is asked for."""
        if requested is None:
            return self.egress_policy()
        policy = parse_policy(requested)
        within_cap(policy, self.network_max, self.network_internal)
        return policy

    def policy(self) -> CellPolicy:
        return CellPolicy(
            memory_mb=self.memory_mb,
            cpus=self.cpus,
            pids_max=self.pids_max,
            disk_mb=self.disk_mb,
            # Egress goes through the proxies; the cell's own loopback serves exposed ports.
            network="loopback",
            inherit_env=self.inherit_env,
            allow_degraded=frozenset(self.allow_degraded),
            code_python=self.code_python,
            pod_image=self.image.oci,
        )

    def resources(self, requested: dict[str, Any] | None = None) -> dict[str, Any]:
        """A sandbox's cpus, memory_mb and disk_mb: the request's within this template's
        max_* (400 beyond), the template's own for what it leaves out."""
        effective: dict[str, Any] = {}
        for name in RESOURCES:
            default = getattr(self, name)
            cap = getattr(self, f"max_{name}") or default
            value = (requested or {}).get(name)
            if value is not None and value > cap:
                raise ServiceError(
                    ErrorCode.BAD_REQUEST,
                    f"resources.{name} may not exceed the template's max_{name} ({cap})",
                    {"field": f"resources.{name}", "limit": cap},
                )
            effective[name] = default if value is None else value
        return effective

    def policy_with(self, policy: CellPolicy, resources: dict[str, Any]) -> CellPolicy:
        """`policy` (this template's) with a sandbox's own resources."""
        return dataclasses.replace(policy, **self.resources(resources))

    def public(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


def builtin_templates() -> dict[str, Template]:
    """`default` (the host's system, fast) and `code-interpreter` (Debian with Python and the
    scientific stack, SPEC §10, and Node.js for javascript and typescript contexts): built on
    first use, so no warm pool until then. The Python packages are the versions of sandcell's
    `interpreter` extra (pyproject.toml), so charts come out as on the default template."""
    science = ImageSpec(
        base="debian:bookworm",
        apt=("python3", "nodejs"),
        pip=(
            "ipython==9.18.1",
            "ipykernel==7.4.0",
            "matplotlib-inline==0.2.2",
            "matplotlib==3.11.2",
            "numpy==2.4.6",
            "pandas==3.1.1",
            "e2b-charts==1.0.0",  # a figure's chart data (result.chart)
            "pydantic==2.14.4",
        ),
        workdir="/workspace",
    )
    return {
        DEFAULT_TEMPLATE: Template(),
        CODE_INTERPRETER: Template(
            name=CODE_INTERPRETER,
            memory_mb=1024,
            warm_pool=0,
            image=science,
            code_python="/usr/bin/python3",  # the image's own, with its IPython
        ),
    }


def parse_templates(raw: dict[str, Any], config_dir: Path | None = None) -> dict[str, Template]:
    """`config_dir`: where relative paths in `image` tables are read from."""
    tables = raw.get("templates", {})
    if not isinstance(tables, dict):
        raise ConfigError("[templates] must be a table of tables")
    templates: dict[str, Template] = {}
    for name, values in tables.items():
        if not isinstance(values, dict):
            raise ConfigError(f"[templates.{name}] must be a table")
        image = values.get("image", {})
        if not isinstance(image, dict):
            raise ConfigError(f"[templates.{name}] image must be a table")
        context = {"context_dir": str((config_dir or Path.cwd()).resolve())}
        try:
            templates[name] = Template(name=name, **{**values, "image": {**image, **context}})
        except (ValidationError, TypeError) as exc:
            raise ConfigError(f"[templates.{name}]: {_describe(exc)}") from None
    for name, template in builtin_templates().items():
        templates.setdefault(name, template)
    return templates


def load_config(path: Path | None) -> dict[str, Any]:
    if path is None:
        return {}
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path} is not valid TOML: {exc}") from None


def _describe(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        return "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())
    return str(exc)
