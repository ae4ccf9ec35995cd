"""Replays what the dynk8s stack declares into moto_server, and reads the Auto Scaling groups back.

The Go test (e2e/autoscaler_test.go) runs the program under the mock engine and passes the declared resources' inputs
as JSON; this script only translates Pulumi input names to AWS API parameters. An input it does not know fails the
run, so a new launch-template or group input is never dropped silently.

    moto_aws.py setup ENDPOINT REGION < plan.json    -> JSON: admin key, users' keys, launch template ids
    moto_aws.py groups ENDPOINT REGION KEY SECRET    -> JSON: every group's desired capacity, tags, instances
    moto_aws.py instances ENDPOINT REGION KEY SECRET -> JSON: instance id -> state
    moto_aws.py vcpus ENDPOINT REGION KEY SECRET TYPE... -> JSON: instance type -> default vCPUs

moto must run with INITIAL_NO_AUTH_ACTION_COUNT=3: setup spends those three unauthenticated calls on an admin user
and its key, and makes everything else as that admin.
"""

import base64
import json
import sys

import boto3

# Inputs with no counterpart in the AWS API call, or none that moto or the autoscaler reads.
LT_IGNORED = {
    "description": "shown in the console only",
    "tags": "tags of the template itself, not of what it launches",
    "updateDefaultVersion": "Terraform-side: new versions become the default; the group pins its version anyway",
    "namePrefix": "the provider makes the name from it; the replay keeps the mock engine's name",
}
GROUP_IGNORED = {
    "waitForCapacityTimeout": "Terraform-side wait, no API parameter",
    "namePrefix": "the provider makes the name from it; the replay keeps the mock engine's name",
    "forceDeleteWarmPool": "Terraform-side: how a warm pool is deleted, no API parameter",
}


def camel_to_pascal(key):
    return key[:1].upper() + key[1:]


def api_struct(value):
    """Pulumi's camelCase object keys to the API's PascalCase; "true"/"false" strings to booleans."""
    if isinstance(value, dict):
        return {camel_to_pascal(k): api_struct(v) for k, v in value.items()}
    if isinstance(value, list):
        return [api_struct(v) for v in value]
    if value in ("true", "false"):
        return value == "true"
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def substitute(value, ids):
    """Replaces the mock engine's ids (subnets, security groups, launch templates) with moto's."""
    if isinstance(value, dict):
        return {k: substitute(v, ids) for k, v in value.items()}
    if isinstance(value, list):
        return [substitute(v, ids) for v in value]
    if isinstance(value, str):
        return ids.get(value, value)
    return value


def launch_template_data(name, inputs):
    data = {}
    for key, value in inputs.items():
        if key in LT_IGNORED:
            continue
        if key == "vpcSecurityGroupIds":
            data["SecurityGroupIds"] = value
        elif key == "tagSpecifications":
            data["TagSpecifications"] = [
                {"ResourceType": spec["resourceType"],
                 "Tags": [{"Key": k, "Value": v} for k, v in sorted(spec["tags"].items())]}
                for spec in value
            ]
        elif key == "userData":
            # Already base64, as the API takes it; check it is.
            base64.b64decode(value, validate=True)
            data["UserData"] = value
        elif key in ("blockDeviceMappings", "metadataOptions", "iamInstanceProfile", "imageId", "instanceType",
                     "hibernationOptions"):
            data[camel_to_pascal(key)] = api_struct(value)
        else:
            sys.exit(f"launch template {name}: input {key!r} is not replayed; teach moto_aws.py about it")
    return data


def group_params(name, inputs):
    params = {"AutoScalingGroupName": name}
    suspended, warm = [], None
    for key, value in inputs.items():
        if key in GROUP_IGNORED:
            continue
        if key == "launchTemplate":
            params["LaunchTemplate"] = {"LaunchTemplateId": value["id"], "Version": value["version"]}
        elif key == "mixedInstancesPolicy":
            params["MixedInstancesPolicy"] = api_struct(value)
        elif key in ("minSize", "maxSize", "desiredCapacity"):
            params[camel_to_pascal(key)] = int(value)
        elif key == "capacityRebalance":
            params["CapacityRebalance"] = bool(value)
        elif key == "vpcZoneIdentifiers":
            params["VPCZoneIdentifier"] = ",".join(value)
        elif key == "tags":
            params["Tags"] = [
                {"ResourceId": name, "ResourceType": "auto-scaling-group", "Key": t["key"], "Value": t["value"],
                 "PropagateAtLaunch": bool(t.get("propagateAtLaunch", False))}
                for t in value
            ]
        elif key == "suspendedProcesses":
            suspended = value
        elif key == "warmPool":
            # Its own call (PutWarmPool) once the group exists; moto 5.2.1 keeps the configuration but launches no
            # warm instance (moto/autoscaling/models.py, describe_warm_pool).
            warm = {"AutoScalingGroupName": name, **api_struct(value)}
        else:
            sys.exit(f"group {name}: input {key!r} is not replayed; teach moto_aws.py about it")
    # The stack never sets the desired capacity (the autoscaler owns it); the API then starts at MinSize.
    return params, suspended, warm


def setup(endpoint, region):
    plan = json.load(sys.stdin)
    kw = dict(region_name=region, endpoint_url=endpoint)
    boot = boto3.client("iam", aws_access_key_id="bootstrap", aws_secret_access_key="bootstrap", **kw)
    admin_arn = boot.create_user(UserName="e2e-admin")["User"]["Arn"]  # unauthenticated call 1 of 3
    boot.put_user_policy(UserName="e2e-admin", PolicyName="all", PolicyDocument=json.dumps(  # call 2
        {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}))
    key = boot.create_access_key(UserName="e2e-admin")["AccessKey"]  # call 3; from here on, signed
    admin = dict(aws_access_key_id=key["AccessKeyId"], aws_secret_access_key=key["SecretAccessKey"], **kw)
    ec2, asg, iam = (boto3.client(s, **admin) for s in ("ec2", "autoscaling", "iam"))

    ids = {}
    for vpc in plan["vpcs"]:
        ids[vpc["id"]] = ec2.create_vpc(CidrBlock=vpc["cidrBlock"])["Vpc"]["VpcId"]
    for sn in plan["subnets"]:
        ids[sn["id"]] = ec2.create_subnet(VpcId=ids[sn["vpcId"]], CidrBlock=sn["cidrBlock"],
                                          AvailabilityZone=sn["availabilityZone"])["Subnet"]["SubnetId"]
    for sg in plan["securityGroups"]:
        ids[sg["id"]] = ec2.create_security_group(GroupName=sg["name"], Description=sg["name"],
                                                  VpcId=ids[sg["vpcId"]])["GroupId"]
    for prof in plan["instanceProfiles"]:
        # Without the declared path: the launch template names the profile by the ARN the mock engine answered,
        # which has none (the real stack passes the profile's own ARN output, path included).
        iam.create_instance_profile(InstanceProfileName=prof)
    for lt in plan["launchTemplates"]:
        data = launch_template_data(lt["name"], substitute(lt["inputs"], ids))
        ids[lt["id"]] = ec2.create_launch_template(LaunchTemplateName=lt["name"],
                                                   LaunchTemplateData=data)["LaunchTemplate"]["LaunchTemplateId"]
    for g in plan["groups"]:
        params, suspended, warm = group_params(g["name"], substitute(g["inputs"], ids))
        asg.create_auto_scaling_group(**params)
        if suspended:
            asg.suspend_processes(AutoScalingGroupName=g["name"], ScalingProcesses=suspended)
        if warm:
            asg.put_warm_pool(**warm)

    users = {}
    for u in plan["users"]:
        iam.create_user(UserName=u["name"])
        iam.put_user_policy(UserName=u["name"], PolicyName="policy", PolicyDocument=u["policy"])
        for i, doc in enumerate(u.get("more") or []):
            iam.put_user_policy(UserName=u["name"], PolicyName=f"more-{i}", PolicyDocument=actions_only(doc))
        k = iam.create_access_key(UserName=u["name"])["AccessKey"]
        users[u["name"]] = {"key": k["AccessKeyId"], "secret": k["SecretAccessKey"]}
    if "gateway" in plan:
        ids[plan["gateway"]["id"]] = run_stopped(ec2, substitute(plan["gateway"]["inputs"], ids))

    roles = {}
    sts = boto3.client("sts", **admin)
    # The role trusts the admin, who assumes it as EC2 would for an instance of its profile (moto 5.2.1 cannot
    # evaluate a service principal: moto/sts/models.py raises on it).
    trust = json.dumps({"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Principal": {"AWS": admin_arn}, "Action": "sts:AssumeRole"}]})
    for r in plan.get("roles", []):
        arn = iam.create_role(RoleName=r["name"], AssumeRolePolicyDocument=trust)["Role"]["Arn"]
        for i, doc in enumerate(r["policies"]):
            iam.put_role_policy(RoleName=r["name"], PolicyName=f"policy-{i}", PolicyDocument=actions_only(doc))
        c = sts.assume_role(RoleArn=arn, RoleSessionName="e2e-instance")["Credentials"]
        roles[r["name"]] = {"key": c["AccessKeyId"], "secret": c["SecretAccessKey"], "token": c["SessionToken"]}
    json.dump({"admin": {"key": key["AccessKeyId"], "secret": key["SecretAccessKey"]}, "users": users,
               "roles": roles, "ids": ids}, sys.stdout)


def actions_only(doc):
    """A policy document's statements with their actions and effect only. moto 5.2.1 checks a request against the
    resource "*" and without the request's resource tags (moto/iam/access_control.py, is_action_permitted and
    _check_conditions), so a statement scoped to an ARN or a tag never matches there: what moto checks of the role is
    which actions it may call. The scoping is pinned by the policy tests under the mock engine instead."""
    policy = json.loads(doc)
    policy["Statement"] = [{"Effect": st["Effect"], "Action": st["Action"], "Resource": "*"}
                           for st in policy["Statement"]]
    return json.dumps(policy)


def cache_volumes(endpoint, region, key, secret):
    """The build cache volumes EC2 knows (tag dynk8s:cache), by id: their state."""
    ec2 = boto3.client("ec2", region_name=region, endpoint_url=endpoint, aws_access_key_id=key,
                       aws_secret_access_key=secret)
    pages = ec2.get_paginator("describe_volumes").paginate(Filters=[{"Name": "tag-key", "Values": ["dynk8s:cache"]}])
    json.dump({v["VolumeId"]: v["State"] for v in pages.build_full_result()["Volumes"]}, sys.stdout)


def vcpus(endpoint, region, key, secret, *types):
    ec2 = boto3.client("ec2", region_name=region, endpoint_url=endpoint, aws_access_key_id=key,
                       aws_secret_access_key=secret)
    out = {t["InstanceType"]: t["VCpuInfo"]["DefaultVCpus"]
           for t in ec2.describe_instance_types(InstanceTypes=list(types))["InstanceTypes"]}
    json.dump(out, sys.stdout)


def fleet(endpoint, region, key, secret, template):
    """Launches three instances from a replayed launch template and leaves one terminated, one stopped and one
    running, for the stale-node cleanup test."""
    ec2 = boto3.client("ec2", region_name=region, endpoint_url=endpoint, aws_access_key_id=key,
                       aws_secret_access_key=secret)
    ids = [i["InstanceId"] for i in ec2.run_instances(LaunchTemplate={"LaunchTemplateName": template}, MinCount=3,
                                                       MaxCount=3)["Instances"]]
    ec2.terminate_instances(InstanceIds=[ids[0]])
    ec2.stop_instances(InstanceIds=[ids[1]])
    json.dump({"terminated": ids[0], "stopped": ids[1], "running": ids[2]}, sys.stdout)


def launch(endpoint, region, key, secret, group, count):
    """Raises a group's desired capacity to count and prints its instance ids, for the CSR approver test."""
    asg = boto3.client("autoscaling", region_name=region, endpoint_url=endpoint, aws_access_key_id=key,
                       aws_secret_access_key=secret)
    asg.set_desired_capacity(AutoScalingGroupName=group, DesiredCapacity=int(count))
    g = asg.describe_auto_scaling_groups(AutoScalingGroupNames=[group])["AutoScalingGroups"][0]
    json.dump(sorted(i["InstanceId"] for i in g["Instances"]), sys.stdout)


def run_stopped(ec2, inputs):
    """Launches an instance as declared and stops it, returning its id: the burst test's gateway, idle when the burst
    begins."""
    tags = [{"Key": k, "Value": v} for k, v in sorted(inputs.get("tags", {}).items())]
    i = ec2.run_instances(ImageId=inputs["ami"], InstanceType=inputs["instanceType"], MinCount=1, MaxCount=1,
                          SubnetId=inputs["subnetId"], PrivateIpAddress=inputs["privateIp"],
                          SecurityGroupIds=inputs.get("vpcSecurityGroupIds", []),
                          TagSpecifications=[{"ResourceType": "instance", "Tags": tags}])["Instances"][0]
    ec2.stop_instances(InstanceIds=[i["InstanceId"]])
    return i["InstanceId"]


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    {"setup": setup, "cache-volumes": cache_volumes, "vcpus": vcpus, "fleet": fleet, "launch": launch}[cmd](*args)
