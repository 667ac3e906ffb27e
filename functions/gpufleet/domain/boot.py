"""What boots an instance type, how its network interfaces are laid out, what NCCL needs.

A deployment boots the instance types whose (architecture, accelerator family) it has an image
for: one launch template per `TemplateKey`, that is per boot target and EFA width. Selection
never picks a type no template of the deployment boots (`bootable`), and CreateFleet overrides
cannot set network interfaces, so a launch groups its overrides by the template each type
launches from (`template_key`).

EFA layout (AWS EC2 User Guide, "Maximize network bandwidth on Amazon EC2 instances with
multiple network cards"): the primary interface is network card 0, device index 0; each further
network card that carries EFA gets an EFA-only interface at device index 0. Where card 0 carries
EFA too, the primary is an EFA with ENA (`efa`), else a plain ENA (`interface`: p6-b300, whose
17 cards take 16 EFAs).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal, get_args

from gpufleet.domain.catalog import Arch, InstanceType

BootFamily = Literal["nvidia", "neuron", "cpu"]
BOOT_FAMILIES: tuple[BootFamily, ...] = get_args(BootFamily)
_FAMILY_OF_ACCELERATOR: dict[str, BootFamily] = {
    "nvidia": "nvidia",
    "trainium": "neuron",
    "inferentia": "neuron",
    "none": "cpu",
}
_FAMILY_NAMES: dict[str, str] = {"nvidia": "NVIDIA", "neuron": "Neuron", "cpu": "CPU-only"}

# Types whose EFA does RDMA between accelerators and the network (GPUDirect RDMA on NVIDIA,
# Neuron's EFA on Trainium): aws-ofi-nccl and the Neuron docs set FI_EFA_USE_DEVICE_RDMA=1 there.
_RDMA_FAMILIES = frozenset(
    {"p4d", "p4de", "p5", "p5e", "p5en", "p6-b200", "p6-b300", "p6e-gb200", "trn1", "trn1n", "trn2"}
)


@dataclass(frozen=True, order=True)
class BootTarget:
    """An (architecture, accelerator family) a launch template's image boots."""

    arch: Arch
    family: BootFamily

    @property
    def name(self) -> str:
        return f"{self.arch}-{self.family}"

    def describe(self) -> str:
        return f"{self.arch} + {_FAMILY_NAMES[self.family]}"

    @classmethod
    def parse(cls, name: str) -> BootTarget:
        arch, _, family = name.partition("-")
        if arch not in get_args(Arch) or family not in BOOT_FAMILIES:
            raise ValueError(f"not a boot target: {name!r} (ARCH-FAMILY, e.g. x86_64-nvidia)")
        return cls(arch, family)  # type: ignore[arg-type]


# What public images exist for (the stack's defaults, topology.BOOT_IMAGES); no Neuron type is
# arm64.
STOCK_TARGETS: frozenset[BootTarget] = frozenset(
    {
        BootTarget("x86_64", "nvidia"),
        BootTarget("arm64", "nvidia"),
        BootTarget("x86_64", "neuron"),
        BootTarget("x86_64", "cpu"),
        BootTarget("arm64", "cpu"),
    }
)


def boot_target(it: InstanceType) -> BootTarget | None:
    """What image `it` needs; None for accelerators no gpufleet image drives (AMD, Qualcomm,
    Gaudi)."""
    family = _FAMILY_OF_ACCELERATOR.get(it.accelerator)
    return None if family is None else BootTarget(it.arch, family)


def boots(it: InstanceType, bootable: frozenset[BootTarget]) -> bool:
    target = boot_target(it)
    return target is not None and target in bootable


def unbootable_reason(it: InstanceType, bootable: frozenset[BootTarget]) -> str:
    """Why no launch template of the deployment boots `it` (for a refusal)."""
    target = boot_target(it)
    if target is None:
        return f"no gpufleet image drives {it.accelerator} accelerators ({it.name})"
    have = ", ".join(t.describe() for t in sorted(bootable)) or "nothing"
    return f"no launch template boots {target.describe()} (this deployment boots: {have})"


@dataclass(frozen=True, order=True)
class EfaWidth:
    """How many EFA interfaces a launch attaches, over how many network cards."""

    interfaces: int
    cards: int

    @property
    def name(self) -> str:
        spread = "" if self.interfaces == self.cards else f"of{self.cards}"
        return f"efa{self.interfaces}{spread}"


def efa_width(it: InstanceType, nodes: int) -> EfaWidth | None:
    """Multi-node jobs on EFA types take one EFA per network card that carries EFA; None: the
    plain template (one ENA), also for a single node (no traffic between nodes)."""
    if nodes < 2 or not it.efa:
        return None
    return EfaWidth(it.efa_interfaces, it.network_cards)


@dataclass(frozen=True)
class TemplateKey:
    target: BootTarget
    efa: EfaWidth | None = None

    @property
    def name(self) -> str:
        return self.target.name if self.efa is None else f"{self.target.name}-{self.efa.name}"

    @classmethod
    def parse(cls, name: str) -> TemplateKey:
        arch, _, rest = name.partition("-")
        family, _, efa = rest.partition("-")
        target = BootTarget.parse(f"{arch}-{family}")
        if not efa:
            return cls(target)
        interfaces, _, cards = efa.removeprefix("efa").partition("of")
        if not efa.startswith("efa") or not interfaces.isdigit() or not (cards or "0").isdigit():
            raise ValueError(f"not a launch template key: {name!r}")
        width = EfaWidth(int(interfaces), int(cards or interfaces))
        if not 1 <= width.interfaces <= width.cards:
            raise ValueError(f"not a launch template key: {name!r}")
        return cls(target, width)


def template_key(it: InstanceType, nodes: int) -> TemplateKey | None:
    """The launch template `nodes` nodes of `it` launch from; None when no image boots it."""
    target = boot_target(it)
    return None if target is None else TemplateKey(target, efa_width(it, nodes))


def template_keys(
    types: Iterable[InstanceType], bootable: frozenset[BootTarget]
) -> list[TemplateKey]:
    """Every launch template a deployment booting `bootable` needs for `types`: the plain one
    per target, and one per EFA width its multi-node jobs may take."""
    keys: set[TemplateKey] = set()
    for it in types:
        for nodes in (1, 2):
            key = template_key(it, nodes)
            if key is not None and key.target in bootable:
                keys.add(key)
    return sorted(keys, key=lambda k: k.name)


def network_interfaces(width: EfaWidth, security_group_id: str) -> list[dict[str, Any]]:
    """The launch template's NetworkInterfaces for `width` (layout: the module's docstring).
    The subnet is the fleet override's; the security group sits on the interfaces (EC2 refuses
    it on the template too)."""
    # The last `interfaces` cards carry EFA (card 0 does not when there are fewer EFAs).
    first_efa_card = width.cards - width.interfaces

    def interface(card: int, interface_type: str) -> dict[str, Any]:
        return {
            "NetworkCardIndex": card,
            "DeviceIndex": 0,
            "InterfaceType": interface_type,
            "Groups": [security_group_id],
            "DeleteOnTermination": True,
        }

    primary = interface(0, "efa" if first_efa_card == 0 else "interface")
    further = range(max(first_efa_card, 1), width.cards)
    return [primary, *(interface(card, "efa-only") for card in further)]


def efa_environment(it: InstanceType, nodes: int) -> dict[str, str]:
    """What NCCL (aws-ofi-nccl) or the Neuron runtime need in the container to use the node's
    EFAs; empty where the launch attaches none. From AWS's EFA/NCCL guides and aws-samples
    awsome-distributed-training: libfabric's EFA provider, RDMA where the type has it, fork
    safety for data loader workers, and NCCL's bootstrap kept off Docker's and the loopback
    interfaces."""
    if efa_width(it, nodes) is None:
        return {}
    env = {"FI_PROVIDER": "efa", "FI_EFA_FORK_SAFE": "1"}
    if it.family in _RDMA_FAMILIES:
        env["FI_EFA_USE_DEVICE_RDMA"] = "1"
    if boot_target(it) == BootTarget(it.arch, "nvidia"):
        env["NCCL_SOCKET_IFNAME"] = "^docker,lo,veth"
    return env
