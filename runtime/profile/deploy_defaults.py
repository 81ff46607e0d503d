"""How a profile is meant to be deployed: sparsity, the policy of bounded heads, sizes per policy.

Profile version 3 stores each policy's sizes under its own name and fields (`"sizes": {"sink_window":
{"sink": 64, "recent": 256}, "h2o": {"heavy": 128, "recent": 128}}`), so a new policy or size field
needs no edit here. Versions 1 and 2 stored four flat fields that several policies shared
(`FLAT_DEPLOY_FIELDS`); they are read with that meaning.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from ..errors import PlanError, ProfileError
from ..policies import HeadPolicy, bounded_policy_names, make_policy, policy_from_dict

PER_POLICY_SIZES = 3  # the first profile version with "sizes"


@dataclass(frozen=True)
class DeployDefaults:
    """How a profile is meant to be deployed unless the user says otherwise: the sparsity, the
    policy of bounded heads, and sizes per policy (`{"sink_window": {"sink": 64, "recent":
    256}, ...}`, each policy's own fields; a policy not listed takes its own defaults)."""

    sparsity: float = 0.5
    policy: str = "sink_window"
    sizes: dict[str, dict[str, int]] = field(default_factory=dict)

    def __post_init__(self):
        if (
            isinstance(self.sparsity, bool)
            or not isinstance(self.sparsity, (int, float))
            or not 0.0 <= self.sparsity <= 1.0
        ):
            raise ProfileError(f"deploy.sparsity must be a number in [0, 1], got {self.sparsity!r}")
        if self.policy not in bounded_policy_names():
            raise ProfileError(f"deploy.policy must be one of {', '.join(bounded_policy_names())}, got {self.policy!r}")
        if not isinstance(self.sizes, dict):
            raise ProfileError("deploy.sizes must be an object: policy name -> its sizes")
        checked = {}
        for name, sizes in self.sizes.items():
            if not isinstance(sizes, dict):
                raise ProfileError(f"deploy.sizes.{name} must be an object of size fields, got {sizes!r:.40}")
            try:
                checked[name] = policy_from_dict({**sizes, "policy": name}).sizes()
            except PlanError as err:
                raise ProfileError(f"deploy.sizes.{name}: {err}") from None
        object.__setattr__(self, "sizes", checked)

    @classmethod
    def of(cls, *policies: HeadPolicy, sparsity: float = 0.5, policy: str = "sink_window") -> DeployDefaults:
        """Defaults that deploy `policy` at `sparsity` and record the sizes of `policies`."""
        return cls(sparsity, policy, {p.name: p.sizes() for p in policies if p.sizes()})

    def sized(self, name: str, **overrides: int | None) -> HeadPolicy:
        """Policy `name` with the given sizes, else this profile's, else the policy's own defaults."""
        return make_policy(
            name, **{**self.sizes.get(name, {}), **{k: v for k, v in overrides.items() if v is not None}}
        )

    def with_sizes(self, *policies: HeadPolicy) -> DeployDefaults:
        """These defaults with the sizes of `policies` recorded (replacing those of the same names)."""
        return replace(self, sizes={**self.sizes, **DeployDefaults.of(*policies).sizes})

    @property
    def sink_window(self):
        """The sink window these defaults deploy streaming heads with (`sink_window`'s sizes)."""
        return self.sized("sink_window")

    def to_dict(self) -> dict[str, Any]:
        return {"sparsity": self.sparsity, "policy": self.policy, "sizes": self.sizes}


# Versions 1 and 2 stored sizes as flat fields shared between policies: which policy field each fed.
FLAT_DEPLOY_FIELDS = {
    "sink_window": {"sink": "sink", "recent": "recent"},
    "h2o": {"heavy": "heavy", "recent": "h2o_recent"},
    "sink_h2o": {"sink": "sink", "heavy": "heavy", "recent": "h2o_recent"},
}
FLAT_DEPLOY_DEFAULTS = {"sink": 64, "recent": 256, "heavy": 128, "h2o_recent": 128}


def deploy_from_dict(deploy: Any, version: int) -> DeployDefaults:
    if not isinstance(deploy, dict):
        raise ProfileError("field 'deploy' must be an object")
    known = {"sparsity", "policy"} | (set(FLAT_DEPLOY_DEFAULTS) if version < PER_POLICY_SIZES else {"sizes"})
    unknown = set(deploy) - known
    if unknown:
        raise ProfileError(f"unknown deploy field(s) {sorted(unknown)} (profile version {version})")
    if version >= PER_POLICY_SIZES:
        return DeployDefaults(**deploy)
    flat = {**FLAT_DEPLOY_DEFAULTS, **{k: v for k, v in deploy.items() if k in FLAT_DEPLOY_DEFAULTS}}
    for name, value in flat.items():
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ProfileError(f"deploy.{name} must be a positive integer, got {value!r}")
    sizes = {policy: {f: flat[key] for f, key in fields.items()} for policy, fields in FLAT_DEPLOY_FIELDS.items()}
    return DeployDefaults(deploy.get("sparsity", 0.5), deploy.get("policy", "sink_window"), sizes)
