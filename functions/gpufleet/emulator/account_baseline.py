"""What a real account holds before gpufleet's first job, and moto's does not.

- The public SSM parameters of the node images (one per boot target) and of the Powertools
  layer, as the stack resolves them at deploy time: moto serves only a few `/aws/service/`
  trees, and refuses, as SSM does, a PutParameter under `/aws`; the parameter is put in the
  backend, as AWS publishes it. And
  CDK's bootstrap version parameter, which `cdk bootstrap` leaves and every deploy checks.
- Spot's service-linked role under its real name and path (moto's CreateServiceLinkedRole names
  it `AWSServiceRoleForspot`), as in an account that has launched spot before.
- EC2 vCPU quotas in Service Quotas: moto serves only VPC quotas. The values are an account's
  that asked for GPU quota (AWS's defaults are 0 for the GPU families, 5 for Standard): enough
  for the repository's gpufleet.yaml. `set_vcpu_quota` changes one, as an approved request
  would. The answer comes from moto's backend (`patches.EC2_VCPU_QUOTAS`), so calls over HTTP
  (`gpufleet emulator`) get it too, not only the in-process ones.
- Lambda's account settings: moto has no GetAccountSettings. The emulator answers it (a hook at
  the SDK's edge, so for in-process clients only) with an established account's 1,000
  concurrent executions; `set_lambda_concurrency` gives a new account's reduced one.
- A way out of the default VPC: AWS's default VPC has an internet gateway and a 0.0.0.0/0 route
  to it in its main route table (and its default subnets give public IPs); moto's has neither.
- A confirmed subscriber on the alerts topic: an SQS queue of the same account, which SNS
  confirms at once.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from botocore.awsrequest import AWSResponse

from gpufleet import topology
from gpufleet.domain.readiness import DEFAULT_ROUTE, SPOT_ROLE_NAME, VCPU_QUOTAS

if TYPE_CHECKING:
    from gpufleet.emulator.account import Account

AMI_PARAMETER_TYPE = "AWS::SSM::Parameter::Value<AWS::EC2::Image::Id>"
# The Powertools layer's public parameter the functions' layer comes from (infra's default).
POWERTOOLS_LAYER_PARAMETER = "/aws/service/powertools/python/x86_64/python3.12/latest"
POWERTOOLS_LAYER_ARN = (
    "arn:aws:lambda:us-east-1:017000801446:layer:AWSLambdaPowertoolsPythonV3-python312-x86_64:18"
)
# What `cdk bootstrap` leaves (default qualifier), which every CDK template checks at deploy.
CDK_BOOTSTRAP_VERSION_PARAMETER = "/cdk-bootstrap/hnb659fds/version"
CDK_BOOTSTRAP_VERSION = "28"
EC2_VCPU_QUOTAS: dict[str, float] = {
    "L-DB2E81BA": 768,  # Running On-Demand G and VT instances
    "L-3819A6DF": 768,  # All G and VT Spot Instance Requests
    "L-417A185B": 768,  # Running On-Demand P instances
    "L-7212CCBC": 768,  # All P4, P3 and P2 Spot Instance Requests
    "L-C4BD4855": 768,  # All P5 Spot Instance Requests
    "L-1216C47A": 1152,  # Running On-Demand Standard (A, C, D, H, I, M, R, T, Z) instances
    "L-34B43A08": 1152,  # All Standard (A, C, D, H, I, M, R, T, Z) Spot Instance Requests
}
ALERTS_INBOX = "gpufleet-alerts-inbox"
_QUOTAS_ATTRIBUTE = "gpufleet_ec2_vcpu_quotas"
LAMBDA_CONCURRENCY = 1000
_CONCURRENCY_ATTRIBUTE = "gpufleet_concurrent_executions"


def answer_ec2_vcpu_quotas(original: Callable[..., dict[str, Any]]) -> Callable[..., Any]:
    """`ServiceQuotasBackend.get_service_quota` (patches.EC2_VCPU_QUOTAS): EC2's vCPU quotas
    too, from the backend's own values (`set_vcpu_quota`) or the defaults above."""

    def get_service_quota(self: Any, service_code: str, quota_code: str) -> dict[str, Any]:
        quotas: dict[str, float] = getattr(self, _QUOTAS_ATTRIBUTE, EC2_VCPU_QUOTAS)
        if service_code != "ec2" or quota_code not in quotas:
            return original(self, service_code, quota_code)
        return _quota(self.region_name, quota_code, quotas[quota_code])

    return get_service_quota


def _quota(region: str, code: str, value: float) -> dict[str, Any]:
    """GetServiceQuota's `Quota`, as AWS answers for an EC2 vCPU quota."""
    name = next(q.name for q in VCPU_QUOTAS if q.code == code)
    return {
        "ServiceCode": "ec2",
        "ServiceName": "Amazon Elastic Compute Cloud (Amazon EC2)",
        "QuotaArn": f"arn:aws:servicequotas:{region}::ec2/{code}",
        "QuotaCode": code,
        "QuotaName": name,
        "Value": float(value),
        "Unit": "None",
        "Adjustable": True,
        "GlobalQuota": False,
    }


def set_vcpu_quota(account: Account, code: str, value: float) -> None:
    """Give the account another value of an EC2 vCPU quota."""
    from moto.servicequotas.models import servicequotas_backends

    from gpufleet.emulator.account import ACCOUNT_ID

    backend = servicequotas_backends[ACCOUNT_ID][account.region]
    quotas = dict(getattr(backend, _QUOTAS_ATTRIBUTE, EC2_VCPU_QUOTAS))
    quotas[code] = value
    setattr(backend, _QUOTAS_ATTRIBUTE, quotas)


def hooks() -> list[tuple[str, Callable[..., Any]]]:
    """The SDK-edge answers for what moto lacks: Lambda's account settings."""
    return [("before-call.lambda.GetAccountSettings", _lambda_account_settings)]


def _lambda_backend(region: str) -> Any:
    from moto.awslambda.models import lambda_backends

    from gpufleet.emulator.account import ACCOUNT_ID

    return lambda_backends[ACCOUNT_ID][region]


def _lambda_account_settings(**kwargs: Any) -> tuple[AWSResponse, dict[str, Any]]:
    """GetAccountSettings' answer, as Lambda gives it (code sizes are AWS's defaults)."""
    backend = _lambda_backend(kwargs["request_signer"].region_name)
    concurrency = int(getattr(backend, _CONCURRENCY_ATTRIBUTE, LAMBDA_CONCURRENCY))
    functions = backend.list_functions()
    parsed = {
        "AccountLimit": {
            "TotalCodeSize": 80_530_636_800,
            "CodeSizeUnzipped": 262_144_000,
            "CodeSizeZipped": 52_428_800,
            "ConcurrentExecutions": concurrency,
            "UnreservedConcurrentExecutions": concurrency,
        },
        "AccountUsage": {"TotalCodeSize": 0, "FunctionCount": len(functions)},
        "ResponseMetadata": {"HTTPStatusCode": 200},
    }
    return AWSResponse("https://lambda.amazonaws.com/", 200, {}, None), parsed


def set_lambda_concurrency(account: Account, value: int) -> None:
    """Give the account another Lambda concurrency (a new account's is as low as 10)."""
    setattr(_lambda_backend(account.region), _CONCURRENCY_ATTRIBUTE, value)


def populate(account: Account, ami_by_arch: Mapping[str, str]) -> None:
    """Create what the account holds before the first job (see the module's docstring)."""
    _publish_ami_parameters(account, ami_by_arch)
    account.client("ssm").put_parameter(
        Name=CDK_BOOTSTRAP_VERSION_PARAMETER, Value=CDK_BOOTSTRAP_VERSION, Type="String"
    )
    _create_spot_role(account)
    _open_the_default_vpc(account)
    _subscribe_an_operator(account)


def _publish_ami_parameters(account: Account, ami_by_arch: Mapping[str, str]) -> None:
    """Each of the stack's image parameters (topology.BOOT_IMAGES), naming an image of its
    target's architecture."""
    for image in topology.BOOT_IMAGES:
        arch = image.target.partition("-")[0]
        _publish(account, image.ssm_parameter, ami_by_arch[arch], "aws:ec2:image")
    _publish(account, POWERTOOLS_LAYER_PARAMETER, POWERTOOLS_LAYER_ARN, "text")


def _publish(account: Account, name: str, value: str, data_type: str) -> None:
    """A public `/aws/service/` parameter, put in the backend as AWS publishes it."""
    from moto.ssm.models import Parameter, ssm_backends

    from gpufleet.emulator.account import ACCOUNT_ID

    backend = ssm_backends[ACCOUNT_ID][account.region]
    backend._parameters[name].append(
        Parameter(  # type: ignore[abstract]  # as moto builds its own public parameters
            account_id=ACCOUNT_ID,
            name=name,
            value=value,
            parameter_type="String",
            description=None,
            allowed_pattern=None,
            keyid=None,
            last_modified_date=datetime.datetime.now(datetime.UTC),
            version=1,
            data_type=data_type,
        )
    )


def _create_spot_role(account: Account) -> None:
    """Spot's service-linked role, as EC2 creates it at the first spot launch: under its real
    name and path (moto's CreateServiceLinkedRole would name it `AWSServiceRoleForspot`)."""
    service = "spot.amazonaws.com"
    trust = {
        "Version": "2012-10-17",
        "Statement": [
            {"Effect": "Allow", "Principal": {"Service": service}, "Action": "sts:AssumeRole"}
        ],
    }
    account.client("iam").create_role(
        RoleName=SPOT_ROLE_NAME,
        Path=f"/aws-service-role/{service}/",
        AssumeRolePolicyDocument=json.dumps(trust),
        Description="Default EC2 Spot Service Linked Role",
    )


def _open_the_default_vpc(account: Account) -> None:
    ec2 = account.client("ec2")
    [vpc] = ec2.describe_vpcs(Filters=[{"Name": "is-default", "Values": ["true"]}])["Vpcs"]
    gateway = ec2.create_internet_gateway()["InternetGateway"]["InternetGatewayId"]
    ec2.attach_internet_gateway(InternetGatewayId=gateway, VpcId=vpc["VpcId"])
    [main] = ec2.describe_route_tables(
        Filters=[
            {"Name": "vpc-id", "Values": [vpc["VpcId"]]},
            {"Name": "association.main", "Values": ["true"]},
        ]
    )["RouteTables"]
    ec2.create_route(
        RouteTableId=main["RouteTableId"], DestinationCidrBlock=DEFAULT_ROUTE, GatewayId=gateway
    )


def _subscribe_an_operator(account: Account) -> None:
    sqs = account.client("sqs")
    queue_url = sqs.create_queue(QueueName=ALERTS_INBOX)["QueueUrl"]
    queue_arn = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])[
        "Attributes"
    ]["QueueArn"]
    account.client("sns").subscribe(
        TopicArn=account.notify_topic_arn, Protocol="sqs", Endpoint=queue_arn
    )


def stack_parameters() -> dict[str, Any]:
    """The SSM-typed parameters of the deployed stack's template: the AMI, the Powertools
    layer and CDK's bootstrap version."""
    return {
        **{
            f"AmiParameter{image.target}": {
                "Type": AMI_PARAMETER_TYPE,
                "Default": image.ssm_parameter,
            }
            for image in topology.BOOT_IMAGES
        },
        "PowertoolsLayerParameter": {
            "Type": "AWS::SSM::Parameter::Value<String>",
            "Default": POWERTOOLS_LAYER_PARAMETER,
        },
        "BootstrapVersion": {
            "Type": "AWS::SSM::Parameter::Value<String>",
            "Default": CDK_BOOTSTRAP_VERSION_PARAMETER,
        },
    }
