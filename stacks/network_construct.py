"""Where workers run: the configured VPC and subnets, or a small VPC of the stack's own.

The VPC the stack creates when none is configured has two public subnets (two AZs) and no NAT
gateway. Workers get a public IPv4 address on launch and a security group without inbound rules:
- S3 (checkpoints, the agent wheel) and DynamoDB are reached through *gateway* endpoints, which
  cost nothing and keep that traffic, by far the largest, off the internet;
- Step Functions (task tokens, heartbeats), CloudWatch Logs and SSM are reached over the public IP.
  Interface endpoints for them would cost about $0.01 per hour per AZ each (~$45/month for three
  services in two AZs) and still not be enough: a job's container image and its Python packages
  come from public registries, which need a route to the internet anyway. A NAT gateway would add
  ~$33/month per AZ plus $0.045/GB for the same reachability.
With `vpc_id`/`subnets` in the context the stack uses those subnets as given (their routing is
the operator's; private subnets need a NAT gateway or endpoints for the services above).
"""

from __future__ import annotations

from collections.abc import Mapping

from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_s3 as s3
from constructs import Construct

from stacks.config import SpotRelayConfig


class Network(Construct):
    """`vpc`, `subnet_ids_by_zone` (AZ -> subnet id, what SPOTRELAY_SUBNETS carries)."""

    def __init__(self, scope: Construct, id: str, *, config: SpotRelayConfig, flow_logs_bucket: s3.IBucket) -> None:
        super().__init__(scope, id)
        self.vpc: ec2.IVpc
        if config.vpc_id is not None:
            # Only the VPC id is needed (for the workers' security group); the subnets are used by id.
            self.vpc = ec2.Vpc.from_vpc_attributes(
                self,
                "Vpc",
                vpc_id=config.vpc_id,
                availability_zones=[subnet.availability_zone for subnet in config.subnets],
            )
            self.subnet_ids_by_zone: Mapping[str, str] = {
                subnet.availability_zone: subnet.id for subnet in config.subnets
            }
            return

        vpc = ec2.Vpc(
            self,
            "Vpc",
            ip_addresses=ec2.IpAddresses.cidr("10.42.0.0/16"),
            max_azs=2,
            nat_gateways=0,
            subnet_configuration=[
                ec2.SubnetConfiguration(
                    name="Workers",
                    subnet_type=ec2.SubnetType.PUBLIC,
                    cidr_mask=20,
                    map_public_ip_on_launch=True,
                )
            ],
            gateway_endpoints={
                "S3": ec2.GatewayVpcEndpointOptions(service=ec2.GatewayVpcEndpointAwsService.S3),
                "DynamoDB": ec2.GatewayVpcEndpointOptions(service=ec2.GatewayVpcEndpointAwsService.DYNAMODB),
            },
            # Restricting the default security group needs a custom-resource Lambda; nothing the
            # stack launches uses the default group (workers get their own, without ingress).
            restrict_default_security_group=False,
        )
        # Rejected traffic only: what a security review needs, at a fraction of ALL's volume.
        vpc.add_flow_log(
            "RejectedTraffic",
            destination=ec2.FlowLogDestination.to_s3(flow_logs_bucket, "vpc-flow-logs/"),
            traffic_type=ec2.FlowLogTrafficType.REJECT,
        )
        self.vpc = vpc
        self.subnet_ids_by_zone = {subnet.availability_zone: subnet.subnet_id for subnet in vpc.public_subnets}
