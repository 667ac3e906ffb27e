"""What boots an instance type, its EFA width and interfaces, selection's and intake's limit."""

from __future__ import annotations

from typing import cast

import pytest

from gpufleet.adapters.local.memory import InMemoryObjects
from gpufleet.domain.boot import (
    STOCK_TARGETS,
    BootTarget,
    EfaWidth,
    TemplateKey,
    boot_target,
    efa_environment,
    network_interfaces,
    template_key,
    template_keys,
)
from gpufleet.domain.catalog import load_bundled
from gpufleet.domain.job import JobStatus
from gpufleet.domain.selection import NoFeasibleOffering, select
from gpufleet.domain.spec import parse_spec
from gpufleet.settings import Settings
from tests.helpers import SPEC_YAML, intake_for, local_ports, make_settings

CATALOG = load_bundled()
X86_NVIDIA = BootTarget("x86_64", "nvidia")


def kinds(width: EfaWidth) -> list[tuple[int, int, str]]:
    return [
        (i["NetworkCardIndex"], i["DeviceIndex"], i["InterfaceType"])
        for i in network_interfaces(width, "sg-1")
    ]


@pytest.mark.parametrize(
    ("name", "interfaces", "cards"),
    [
        ("p4d.24xlarge", 4, 4),
        ("p5.48xlarge", 32, 32),
        ("p5en.48xlarge", 16, 16),
        ("p6-b300.48xlarge", 16, 17),
        ("trn1.32xlarge", 8, 8),
        ("trn1n.32xlarge", 16, 16),
        ("g5.48xlarge", 1, 1),
    ],
)
def test_a_multi_node_job_takes_one_efa_per_network_card_that_carries_efa(
    name: str, interfaces: int, cards: int
) -> None:
    it = CATALOG.instance_type(name)
    key = template_key(it, nodes=2)
    assert key is not None and key.efa == EfaWidth(interfaces, cards)
    layout = kinds(key.efa)
    efas = [k for k in layout if k[2] in ("efa", "efa-only")]
    assert len(efas) == interfaces
    # One interface per card, the primary on card 0 at device index 0; EFA-only on the rest.
    assert [card for card, _, _ in layout] == list(range(cards))
    assert all(device == 0 for _, device, _ in layout)
    assert layout[0][2] == ("efa" if interfaces == cards else "interface")
    assert {kind for _, _, kind in layout[1:]} <= {"efa-only"}
    # A single node talks to no peer: the plain template, one ENA.
    assert template_key(it, nodes=1) == TemplateKey(boot_target(it) or X86_NVIDIA)


def test_every_interface_carries_the_security_group() -> None:
    assert all(i["Groups"] == ["sg-1"] for i in network_interfaces(EfaWidth(32, 32), "sg-1"))


@pytest.mark.parametrize(
    ("name", "target"),
    [
        ("g5.xlarge", BootTarget("x86_64", "nvidia")),
        ("g5g.xlarge", BootTarget("arm64", "nvidia")),
        ("trn1.2xlarge", BootTarget("x86_64", "neuron")),
        ("inf2.xlarge", BootTarget("x86_64", "neuron")),
        ("c5.xlarge", BootTarget("x86_64", "cpu")),
        ("c6g.xlarge", BootTarget("arm64", "cpu")),
        ("g4ad.xlarge", None),  # AMD: no gpufleet image drives it
    ],
)
def test_each_type_needs_the_image_of_its_arch_and_accelerator(
    name: str, target: BootTarget | None
) -> None:
    assert boot_target(CATALOG.instance_type(name)) == target


def test_template_keys_name_themselves_back() -> None:
    keys = template_keys(CATALOG.instance_types(), STOCK_TARGETS)
    assert all(TemplateKey.parse(k.name) == k for k in keys)
    names = {k.name for k in keys}
    assert {"x86_64-nvidia", "x86_64-nvidia-efa32", "x86_64-nvidia-efa16of17"} <= names
    assert {"x86_64-neuron-efa8", "arm64-cpu"} <= names
    assert template_keys(CATALOG.instance_types(), frozenset({X86_NVIDIA})) == [
        k for k in keys if k.target == X86_NVIDIA
    ]
    for bad in ("x86_64", "mips-nvidia", "x86_64-nvidia-efa", "x86_64-nvidia-efa4of2"):
        with pytest.raises(ValueError, match=r"^not a (boot target|launch template key)"):
            TemplateKey.parse(bad)


def test_efa_environment_is_set_only_where_efa_is_attached() -> None:
    p5 = CATALOG.instance_type("p5.48xlarge")
    assert efa_environment(p5, nodes=2) == {
        "FI_PROVIDER": "efa",
        "FI_EFA_FORK_SAFE": "1",
        "FI_EFA_USE_DEVICE_RDMA": "1",
        "NCCL_SOCKET_IFNAME": "^docker,lo,veth",
    }
    assert efa_environment(p5, nodes=1) == {}
    g5 = efa_environment(CATALOG.instance_type("g5.48xlarge"), nodes=2)
    assert g5["FI_PROVIDER"] == "efa" and "FI_EFA_USE_DEVICE_RDMA" not in g5
    trn1 = efa_environment(CATALOG.instance_type("trn1.32xlarge"), nodes=2)
    assert trn1["FI_EFA_USE_DEVICE_RDMA"] == "1" and "NCCL_SOCKET_IFNAME" not in trn1
    assert efa_environment(CATALOG.instance_type("c5.xlarge"), nodes=2) == {}


TRAINIUM = parse_spec(SPEC_YAML.replace(b"gpu_memory_gib: 16", b"gpu_models: [Trainium]"))
ARM_GPU = parse_spec(SPEC_YAML.replace(b"gpu_memory_gib: 16", b"arch: arm64"))


def test_selection_never_ranks_what_no_template_boots() -> None:
    ranked = select(TRAINIUM.resources, "auto", CATALOG, "us-east-1", bootable=STOCK_TARGETS)
    assert {r.offering.instance_type.family for r in ranked} <= {"trn1", "trn1n", "trn2"}
    nvidia_only = frozenset({X86_NVIDIA})
    with pytest.raises(NoFeasibleOffering) as refused:
        select(TRAINIUM.resources, "auto", CATALOG, "us-east-1", bootable=nvidia_only)
    assert refused.value.constraint == "boot"
    assert "no launch template boots x86_64 + Neuron" in str(refused.value)
    assert "this deployment boots: x86_64 + NVIDIA" in str(refused.value)
    # Where some matching types boot, only they are ranked.
    arm = select(ARM_GPU.resources, "auto", CATALOG, "us-east-1")
    assert {r.offering.instance_type.arch for r in arm} == {"arm64"}
    with pytest.raises(NoFeasibleOffering, match="no launch template boots arm64 \\+ NVIDIA"):
        select(ARM_GPU.resources, "auto", CATALOG, "us-east-1", bootable=nvidia_only)


def test_settings_boot_what_their_templates_name() -> None:
    settings = make_settings(
        launch_templates={
            "x86_64-nvidia": "lt-1",
            "x86_64-nvidia-efa4": "lt-2",
            "arm64-cpu": "lt-3",
        }
    )
    assert settings.bootable == {X86_NVIDIA, BootTarget("arm64", "cpu")}
    assert isinstance(settings, Settings)


def test_intake_fails_a_spec_only_unbootable_types_fit_naming_why() -> None:
    ports = local_ports()
    body = SPEC_YAML.replace(b"gpu_memory_gib: 16", b"gpu_models: [Trainium]")
    cast(InMemoryObjects, ports.objects).objects["jobs/vision/trn.yaml"] = body
    nvidia_only = make_settings(launch_templates={"x86_64-nvidia": "lt-1"})
    outcome = intake_for(ports, nvidia_only).submit_object(
        "jobs/vision/trn.yaml",
        "s3://bucket/jobs/vision/trn.yaml#etag",
        "s3://bucket/jobs/vision/trn.yaml",
    )
    job = ports.jobs.get(outcome.job_id)
    assert job.status is JobStatus.FAILED
    assert job.failure_reason is not None
    assert "no launch template boots x86_64 + Neuron" in job.failure_reason
