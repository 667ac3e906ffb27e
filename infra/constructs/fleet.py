"""What the nodes run with: network, instance role and profile, launch templates, agent.

One launch template per `gpufleet.domain.boot.TemplateKey` of the configured images: per boot
target (architecture and accelerator family: its image, from an SSM parameter resolved at
deploy) and EFA width (the plain one with one ENA; for multi-node jobs on EFA types one EFA
per network card that carries EFA). The Launch function picks the template per instance type
and node count (CreateFleet overrides cannot name network interfaces). What no template boots
is never selected: the keys, in every function's environment, say what the deployment boots.

Job data never reaches the user data: the script below is fixed per deployment (bus, bucket,
log group, agent code location). The node agent finds its job at run time from its own instance
tags (instance metadata tags are enabled) and the run manifest under `runs/` in the bucket.
"""

from __future__ import annotations

import json
import shlex

from aws_cdk import ArnFormat, RemovalPolicy, Stack
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_events as events
from aws_cdk import aws_iam as iam
from aws_cdk import aws_logs as logs
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_s3_assets as s3_assets

from constructs import Construct
from gpufleet import topology
from gpufleet.domain.boot import BootTarget, EfaWidth, network_interfaces, template_keys
from gpufleet.domain.catalog import load_bundled
from gpufleet.domain.config import DataSources, FleetConfig
from infra.config import GpuFleetConfig
from infra.constructs import nag
from infra.constructs.job_role import JobRole
from infra.constructs.logs import retention
from infra.constructs.node_access import grant_node_access

AGENT_MODULE = "gpufleet.agent"
AGENT_HOME = "/opt/gpufleet"
AGENT_ENV_FILE = "/etc/gpufleet/agent.env"
AGENT_METRIC_NAMESPACES = ("CWAgent", "GpuFleet/Jobs")


class Fleet(Construct):
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        config: GpuFleetConfig,
        fleet_config: FleetConfig,
        bus: events.IEventBus,
        bucket: s3.IBucket,
        agent_code: s3_assets.Asset,
    ) -> None:
        super().__init__(scope, construct_id)
        stack = Stack.of(self)
        self.subnet_ids = config.subnet_ids

        vpc = ec2.Vpc.from_vpc_attributes(
            self, "Vpc", vpc_id=config.vpc_id, availability_zones=stack.availability_zones
        )
        self.security_group = ec2.SecurityGroup(
            self,
            "NodeSecurityGroup",
            vpc=vpc,
            description="gpufleet GPU nodes: no inbound from outside, HTTPS out only",
            allow_all_outbound=False,
        )
        self.security_group.add_egress_rule(
            ec2.Peer.any_ipv4(),
            ec2.Port.tcp(443),
            "HTTPS to AWS APIs, container registries and package indexes",
        )
        if config.intra_fleet_traffic:
            # NCCL and EFA need every port between the nodes of a multi-node job; only members of
            # this group can reach each other, nothing outside it can.
            self.security_group.add_ingress_rule(
                self.security_group, ec2.Port.all_traffic(), "Multi-node jobs (NCCL, EFA)"
            )
            self.security_group.add_egress_rule(
                self.security_group, ec2.Port.all_traffic(), "Multi-node jobs (NCCL, EFA)"
            )

        self.agent_log_group = logs.LogGroup(
            self,
            "AgentLogs",
            retention=retention(config.log_retention_days),
            removal_policy=RemovalPolicy.RETAIN,
        )

        self.instance_role = iam.Role(
            self,
            "InstanceRole",
            assumed_by=iam.ServicePrincipal("ec2.amazonaws.com"),
            description="gpufleet GPU nodes: report to the bus, publish metrics, read their run",
            managed_policies=[
                iam.ManagedPolicy.from_aws_managed_policy_name("AmazonSSMManagedInstanceCore")
            ],
        )
        nag.acknowledge(
            self.instance_role,
            "AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/"
            "AmazonSSMManagedInstanceCore]",
            "Session Manager is the only way onto a node (no SSH, no inbound rules); this AWS "
            "managed policy is the documented minimum for the SSM agent and AWS maintains it.",
        )
        self._grant_instance_role(bus, bucket, agent_code)
        self.job_role = JobRole(
            self,
            "JobRole",
            instance_role=self.instance_role,
            bucket=bucket,
            checkpoints=config.checkpoints,
        )
        self.job_role.grant_assume(self.instance_role)
        grant_node_access(self, self.instance_role, self.security_group, fleet_config)
        if NEEDS_UBUNTU_ARCHIVE & set(volume_tools_for(fleet_config.data)):
            self.security_group.add_egress_rule(
                ec2.Peer.any_ipv4(),
                ec2.Port.tcp(80),
                "Ubuntu package archive (HTTP; apt checks its signatures): EFS and S3 mount tools",
            )

        user_data = ec2.UserData.for_linux()
        user_data.add_commands(
            *_agent_bootstrap(
                region=stack.region,
                bus_name=bus.event_bus_name,
                bucket_name=bucket.bucket_name,
                log_group=self.agent_log_group.log_group_name,
                job_role=self.job_role.role.role_arn,
                code_bucket=agent_code.s3_bucket_name,
                code_key=agent_code.s3_object_key,
                pip_packages=config.agent_pip_packages,
                data=fleet_config.data,
            )
        )
        profile = iam.InstanceProfile(self, "InstanceProfile", role=self.instance_role)
        images = config.boot_images()
        self.images = {
            image.target: ec2.MachineImage.from_ssm_parameter(
                image.ssm_parameter, os=ec2.OperatingSystemType.LINUX
            )
            for image in images
        }
        self.image_ids = [self.images[i.target].get_image(self).image_id for i in images]
        bootable = frozenset(BootTarget.parse(image.target) for image in images)
        root_device = {image.target: image.root_device for image in images}
        self.launch_templates: dict[str, ec2.LaunchTemplate] = {
            key.name: self._launch_template(
                "LaunchTemplate" + "".join(part.capitalize() for part in key.name.split("-")),
                config,
                user_data,
                profile,
                image=self.images[key.target.name],
                root_device=root_device[key.target.name],
                efa=key.efa,
            )
            for key in template_keys(load_bundled().instance_types(), bootable)
        }

    def _launch_template(
        self,
        construct_id: str,
        config: GpuFleetConfig,
        user_data: ec2.UserData,
        profile: iam.IInstanceProfile,
        *,
        image: ec2.IMachineImage,
        root_device: str,
        efa: EfaWidth | None,
    ) -> ec2.LaunchTemplate:
        template = ec2.LaunchTemplate(
            self,
            construct_id,
            machine_image=image,
            user_data=user_data,
            instance_profile=profile,
            # An EFA template names its security group on the interfaces (EC2 refuses both).
            security_group=None if efa else self.security_group,
            require_imdsv2=True,
            http_tokens=ec2.LaunchTemplateHttpTokens.REQUIRED,
            # The metadata service answers the host only: a container on a bridge network is one
            # hop further; one on the host network is blocked by the boot script (_imds_block).
            http_put_response_hop_limit=1,
            instance_metadata_tags=True,
            detailed_monitoring=True,
            ebs_optimized=True,
            block_devices=[
                ec2.BlockDevice(
                    device_name=root_device,
                    volume=ec2.BlockDeviceVolume.ebs(
                        config.root_volume_gib,
                        volume_type=ec2.EbsDeviceVolumeType.GP3,
                        encrypted=True,
                        delete_on_termination=True,
                    ),
                )
            ],
        )
        cfn_template = template.node.default_child
        assert isinstance(cfn_template, ec2.CfnLaunchTemplate)
        cfn_template.add_property_override(
            "LaunchTemplateData.TagSpecifications",
            [
                {"ResourceType": kind, "Tags": [{"Key": topology.TAG_MANAGED, "Value": "true"}]}
                for kind in topology.TAGGED_AT_LAUNCH
            ],
        )
        if efa is not None:
            # One interface per network card, EFA on each that carries it; the subnet comes
            # from the fleet's override.
            cfn_template.add_property_override(
                "LaunchTemplateData.NetworkInterfaces",
                network_interfaces(efa, self.security_group.security_group_id),
            )
        return template

    def launch_templates_value(self) -> str:
        """ENV_LAUNCH_TEMPLATES: every template's id by key."""
        return topology.launch_templates_value(
            {key: t.launch_template_id or "" for key, t in self.launch_templates.items()}
        )

    # ARNs the Launch function's policy names -------------------------------------------------
    def arn(self, resource: str, name: str, *, account: bool = True) -> str:
        arn: str = Stack.of(self).format_arn(
            service="ec2",
            resource=resource,
            resource_name=name,
            account=None if account else "",
            arn_format=ArnFormat.SLASH_RESOURCE_NAME,
        )
        return arn

    def launch_template_arns(self) -> list[str]:
        return [
            self.arn("launch-template", template.launch_template_id or "")
            for template in self.launch_templates.values()
        ]

    def existing_resource_arns(self) -> list[str]:
        """What a launch uses but does not create: templates, subnets, security group, AMIs."""
        return [
            *self.launch_template_arns(),
            self.arn("security-group", self.security_group.security_group_id),
            *(self.arn("image", image_id, account=False) for image_id in self.image_ids),
            *(self.arn("subnet", subnet) for subnet in self.subnet_ids),
        ]

    def _grant_instance_role(
        self,
        bus: events.IEventBus,
        bucket: s3.IBucket,
        agent_code: s3_assets.Asset,
    ) -> None:
        role = self.instance_role
        role.add_to_policy(
            iam.PolicyStatement(
                sid="AgentReports",
                actions=["events:PutEvents"],
                resources=[bus.event_bus_arn],
                conditions={"StringEquals": {"events:source": topology.AGENT_SOURCE}},
            )
        )
        metrics = iam.PolicyStatement(
            sid="GpuMetrics",
            actions=["cloudwatch:PutMetricData"],
            resources=["*"],
            conditions={"StringEquals": {"cloudwatch:namespace": list(AGENT_METRIC_NAMESPACES)}},
        )
        role.add_to_policy(metrics)
        role.add_to_policy(
            iam.PolicyStatement(
                sid="AgentLogs",
                actions=["logs:CreateLogStream", "logs:PutLogEvents", "logs:DescribeLogStreams"],
                resources=[self.agent_log_group.log_group_arn],
            )
        )
        runs = bucket.arn_for_objects(f"{topology.RUNS_PREFIX}*")
        role.add_to_policy(
            iam.PolicyStatement(sid="ReadRuns", actions=["s3:GetObject"], resources=[runs])
        )
        # The agent keeps each run's usage (a sample a minute) in runs/<job>/usage/<instance>.json.
        usage = bucket.arn_for_objects(f"{topology.RUNS_PREFIX}*/usage/*")
        role.add_to_policy(
            iam.PolicyStatement(sid="UsageData", actions=["s3:PutObject"], resources=[usage])
        )
        role.add_to_policy(
            iam.PolicyStatement(
                sid="ReadAgentCode",
                actions=["s3:GetObject"],
                resources=[
                    Stack.of(self).format_arn(
                        service="s3",
                        region="",
                        account="",
                        resource=agent_code.s3_bucket_name,
                        resource_name=agent_code.s3_object_key,
                        arn_format=ArnFormat.SLASH_RESOURCE_NAME,
                    )
                ],
            )
        )
        policy = role.node.try_find_child("DefaultPolicy")
        assert policy is not None
        nag.acknowledge_all(
            policy,
            nag.wildcard_resources("*"),
            "cloudwatch:PutMetricData has no resource-level permissions; the statement is "
            "limited by the cloudwatch:namespace condition to CWAgent and GpuFleet/Jobs.",
        )
        nag.acknowledge_all(
            policy,
            nag.wildcard_resources(f"{nag.arn_of(bucket)}/{topology.RUNS_PREFIX}*"),
            "Run manifests are objects named by job id under runs/; the node reads its own, "
            "and the prefix is the narrowest grant S3 can express for unknown job ids.",
        )
        nag.acknowledge_all(
            policy,
            nag.wildcard_resources(f"{nag.arn_of(bucket)}/{topology.RUNS_PREFIX}*/usage/*"),
            "Usage samples are written under runs/<job>/usage/ for unknown job ids; the node "
            "writes its own usage object there.",
        )


# The agent's unit. Its exit status is the agent's own, never the run's (gpufleet.agent's
# __main__): 1 is the agent failing (the network, an AWS API), which a restart may fix, and the
# run ledger in the state directory keeps a restarted agent from running anything twice; 2 is
# bad arguments, which no restart fixes. Five starts in ten minutes at most: then systemd gives
# up, the node goes silent, and the control plane's heartbeat timeout takes it for lost.
AGENT_STATE_DIRECTORY = "gpufleet"
AGENT_UNIT_HEAD = (
    "[Unit]",
    "Description=gpufleet node agent",
    "Wants=network-online.target",
    "After=network-online.target docker.service",
    "StartLimitIntervalSec=600",
    "StartLimitBurst=5",
    "[Service]",
    "Type=simple",
    f"StateDirectory={AGENT_STATE_DIRECTORY}",
)
AGENT_UNIT_RESTARTS = (
    "Restart=on-failure",
    "RestartSec=10",
    "RestartPreventExitStatus=2",
)


def _agent_bootstrap(
    *,
    region: str,
    bus_name: str,
    bucket_name: str,
    log_group: str,
    job_role: str,
    code_bucket: str,
    code_key: str,
    pip_packages: str,
    data: DataSources,
) -> list[str]:
    """A fixed boot script: install the agent and the volume tools the deployment's data
    sources need, and start the agent as a systemd service.

    Every interpolated value is a property of the deployment, none comes from a job. The agent
    needs boto3 only: the AMI's python3 is used as it is when it has boto3, else a virtualenv
    gets the packages from PyPI (HTTPS, which the security group allows).
    """
    venv = f"{AGENT_HOME}/venv"
    python = f"{AGENT_HOME}/python"
    packages = " ".join(shlex.quote(p) for p in pip_packages.split())
    return [
        "set -euo pipefail",
        f"install -d -m 0755 {AGENT_HOME} {AGENT_HOME}/app /etc/gpufleet",
        f"cat > {AGENT_ENV_FILE} <<'ENV'",
        f"AWS_DEFAULT_REGION={region}",
        f"AWS_REGION={region}",
        f"{topology.ENV_EVENT_BUS}={bus_name}",
        f"{topology.ENV_INTAKE_BUCKET}={bucket_name}",
        f"{topology.ENV_AGENT_LOG_GROUP}={log_group}",
        f"{topology.ENV_JOB_ROLE}={job_role}",
        "ENV",
        "if python3 -c 'import boto3' 2>/dev/null; then",
        f'  ln -sf "$(command -v python3)" {python}',
        "else",
        f"  python3 -m venv {venv}",
        f"  {venv}/bin/pip install --quiet --disable-pip-version-check {packages}",
        f"  ln -sf {venv}/bin/python3 {python}",
        "fi",
        # The CPU-only image (Amazon Linux 2023) has no Docker; the DLAMIs have it.
        "if ! command -v docker >/dev/null; then",
        "  if command -v dnf >/dev/null; then dnf install -y -q docker; "
        "else apt-get update -q && apt-get install -y -q docker.io; fi",
        "  systemctl enable --now docker",
        "fi",
        *_volume_tools(data),
        f"{python} - <<'PY'",
        "import boto3, zipfile",
        f"boto3.client('s3', region_name='{region}').download_file("
        f"'{code_bucket}', '{code_key}', '{AGENT_HOME}/agent.zip')",
        f"zipfile.ZipFile('{AGENT_HOME}/agent.zip').extractall('{AGENT_HOME}/app')",
        "PY",
        *_imds_block(),
        "cat > /etc/systemd/system/gpufleet-agent.service <<'UNIT'",
        *AGENT_UNIT_HEAD,
        f"EnvironmentFile={AGENT_ENV_FILE}",
        f"Environment=PYTHONPATH={AGENT_HOME}/app",
        # systemd expands ${VAR} from the EnvironmentFile; the values are the deployment's.
        f"ExecStart={python} -m {AGENT_MODULE} --bucket ${{{topology.ENV_INTAKE_BUCKET}}} "
        f"--bus ${{{topology.ENV_EVENT_BUS}}} --region ${{AWS_REGION}} "
        f"--job-role ${{{topology.ENV_JOB_ROLE}}} "
        f"--state-dir /var/lib/{AGENT_STATE_DIRECTORY}",
        *AGENT_UNIT_RESTARTS,
        "[Install]",
        "WantedBy=multi-user.target",
        "UNIT",
        "systemctl daemon-reload",
        "systemctl enable --now gpufleet-agent.service",
        *_cloudwatch_agent_gpu_metrics(),
    ]


# The tools the agent runs to mount volumes (agent/prepare.py, docs/data.md), installed at boot
# where the image lacks them, for the volume kinds the deployment can mount: the instance store
# always (it needs no configuration), the others only when gpufleet.yaml configures one. Each is
# best effort: a tool that does not install fails only the runs that mount that kind of volume,
# naming the volume, instead of keeping the agent from starting. The same script serves every
# image, so each step picks its OS family at run time: dnf on Amazon Linux 2023 (the CPU image),
# apt on the Ubuntu Deep Learning AMIs.
EFS_UTILS_TAG = "v2.3.0"  # aws/efs-utils: Ubuntu has no package, it is built from its source
MOUNTPOINT_RELEASES = "https://s3.amazonaws.com/mountpoint-s3-release/latest"
FSX_UBUNTU_KEY = (
    "https://fsx-lustre-client-repo-public-keys.s3.amazonaws.com/fsx-ubuntu-public-key.asc"
)
FSX_UBUNTU_REPO = "https://fsx-lustre-client-repo.s3.amazonaws.com/ubuntu"
FSX_UBUNTU_KEYRING = "/usr/share/keyrings/fsx-ubuntu-public-key.gpg"
FSX_UBUNTU_SOURCES = "/etc/apt/sources.list.d/fsxlustreclientrepo.list"
_APT = "DEBIAN_FRONTEND=noninteractive apt-get install -y -q"
# A failed index fetch (a mirror out of reach) must not stop the install from the rest.
_APT_UPDATE = "(apt-get update -q || true)"

# tool -> (what shows the image has it, dnf steps, apt steps); the steps of one OS family run in
# order, each only when the one before it succeeded.
_VOLUME_TOOLS: dict[str, tuple[str, tuple[str, ...], tuple[str, ...]]] = {
    "mdadm": (
        "command -v mdadm >/dev/null",
        ("dnf install -y -q mdadm",),
        (_APT_UPDATE, f"{_APT} mdadm"),
    ),
    "amazon-efs-utils": (
        "[ -x /sbin/mount.efs ]",
        ("dnf install -y -q amazon-efs-utils",),
        (
            _APT_UPDATE,
            f"{_APT} git binutils rustc cargo pkg-config libssl-dev gettext",
            "rm -rf /tmp/efs-utils",
            f"git clone --quiet --depth 1 --branch {EFS_UTILS_TAG} "
            "https://github.com/aws/efs-utils /tmp/efs-utils",
            "(cd /tmp/efs-utils && ./build-deb.sh)",
            f"{_APT} /tmp/efs-utils/build/amazon-efs-utils*deb",
        ),
    ),
    "mount-s3": (
        "command -v mount-s3 >/dev/null",
        # In the AL2023 repository since 2023.9.20251110; AWS's own package before that.
        (
            "{ dnf install -y -q mount-s3 || "
            f'dnf install -y -q "{MOUNTPOINT_RELEASES}/${{arch}}/mount-s3.rpm"; }}',
        ),
        (
            f'curl -fsSL -o /tmp/mount-s3.deb "{MOUNTPOINT_RELEASES}/${{arch}}/mount-s3.deb"',
            _APT_UPDATE,
            f"{_APT} /tmp/mount-s3.deb",
        ),
    ),
    "lustre-client": (
        "modinfo lustre >/dev/null 2>&1",
        ("dnf install -y -q lustre-client",),
        (
            ". /etc/os-release",
            f"curl -fsSL {FSX_UBUNTU_KEY} | gpg --dearmor > {FSX_UBUNTU_KEYRING}",
            f'echo "deb [signed-by={FSX_UBUNTU_KEYRING}] {FSX_UBUNTU_REPO} '
            f'${{VERSION_CODENAME}} main" > {FSX_UBUNTU_SOURCES}',
            # Only the FSx repository's index (HTTPS): the modules come from there.
            f"apt-get update -q -o Dir::Etc::sourcelist={FSX_UBUNTU_SOURCES} "
            "-o Dir::Etc::sourceparts=- -o APT::Get::List-Cleanup=0",
            f'{_APT} "lustre-client-modules-$(uname -r)"',
        ),
    ),
}

# Volume tools whose Ubuntu install takes packages from the distribution's archive, which EC2's
# Ubuntu mirrors serve over HTTP only (apt checks the archive's signatures).
NEEDS_UBUNTU_ARCHIVE = frozenset({"amazon-efs-utils", "mount-s3"})


def _imds_block() -> list[str]:
    """Keep the job's containers from the metadata service, and so from the instance role:
    they run on the host network in topology.JOBS_SLICE (agent/docker.py), and packets of that
    cgroup (v2) to 169.254.169.254 are rejected (iptables-extensions `cgroup --path`: the
    cgroup and its descendants; the cgroup must exist when the rule is added, so the slice is
    started first). The agent, in its own unit, keeps the service. The container gets its job's
    credentials from the agent on the loopback instead (agent/credentials.py)."""
    return [
        f"cat > /etc/systemd/system/{topology.JOBS_SLICE} <<'SLICE'",
        "[Unit]",
        "Description=gpufleet job containers",
        "SLICE",
        "systemctl daemon-reload",
        f"systemctl start {topology.JOBS_SLICE}",
        f"iptables -I OUTPUT -m cgroup --path {topology.JOBS_SLICE} -d 169.254.169.254 -j REJECT",
    ]


def volume_tools_for(data: DataSources) -> list[str]:
    """The volume tools a node needs for what the deployment's jobs can mount."""
    wanted = {
        "mdadm": True,  # instance-store scratch: any spec may ask for it
        "amazon-efs-utils": bool(data.efs),
        "mount-s3": bool(data.s3),
        "lustre-client": bool(data.fsx_lustre),
    }
    return [tool for tool in _VOLUME_TOOLS if wanted[tool]]


def _steps(steps: tuple[str, ...], indent: str) -> list[str]:
    # Joined with &&: `set -e` does not apply in a subshell whose status `||` tests.
    return [f"{indent}{step}{' &&' if i < len(steps) - 1 else ''}" for i, step in enumerate(steps)]


def _volume_tools(data: DataSources) -> list[str]:
    lines = ['case "$(uname -m)" in aarch64) arch=arm64 ;; *) arch=x86_64 ;; esac']
    for tool in volume_tools_for(data):
        present, dnf, apt = _VOLUME_TOOLS[tool]
        lines += [
            f"if ! {present}; then (",
            "  if command -v dnf >/dev/null; then",
            *_steps(dnf, "    "),
            "  else",
            *_steps(apt, "    "),
            "  fi",
            f") || echo 'gpufleet: {tool} did not install; runs mounting its volumes fail' >&2; fi",
        ]
    return lines


CWAGENT_HOME = "/opt/aws/amazon-cloudwatch-agent"
# The CloudWatch agent's NVIDIA GPU metrics (CWAgent nvidia_smi_*), per GPU of each instance:
# those the dashboard and alarms read (operations.py), and no more (each is a custom metric per
# GPU; the job's GPU memory comes from the node agent, GpuFleet/Jobs GpuMemoryUsed).
CWAGENT_CONFIG = {
    "agent": {"metrics_collection_interval": 60},
    "metrics": {
        "namespace": "CWAgent",
        "append_dimensions": {"InstanceId": "${aws:InstanceId}"},
        "metrics_collected": {
            "nvidia_gpu": {
                "measurement": ["utilization_gpu", "temperature_gpu"],
                "metrics_collection_interval": 60,
            }
        },
    },
}


def _cloudwatch_agent_gpu_metrics() -> list[str]:
    """Install (when the AMI lacks it) and start the CloudWatch agent with NVIDIA GPU metrics.
    Best effort, after the job agent started: metrics must never keep a job from running."""
    config_path = f"{CWAGENT_HOME}/etc/gpufleet-gpu.json"
    return [
        "(",
        "  set -e",
        f"  if [ ! -x {CWAGENT_HOME}/bin/amazon-cloudwatch-agent-ctl ]; then",
        "    curl -fsSL -o /tmp/cwagent.deb "
        "https://amazoncloudwatch-agent.s3.amazonaws.com/ubuntu/amd64/latest/"
        "amazon-cloudwatch-agent.deb",
        "    dpkg -i /tmp/cwagent.deb",
        "  fi",
        f"  install -d {CWAGENT_HOME}/etc",
        f"  cat > {config_path} <<'CWAGENT'",
        json.dumps(CWAGENT_CONFIG, indent=2),
        "CWAGENT",
        f"  {CWAGENT_HOME}/bin/amazon-cloudwatch-agent-ctl -a fetch-config -m ec2 -s "
        f"-c file:{config_path}",
        ") || echo 'gpufleet: the CloudWatch agent did not start; GPU utilization comes from "
        "the node agent only' >&2",
    ]
