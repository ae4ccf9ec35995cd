"""Makes in moto_server what cmd/bake finds of a stack that is up (TestBakeAgainstMoto): the stack's VPC and tagged
subnets, the nodes' security group, the bake's instance profile, the versioned agent bucket with the agent object of
one architecture, and older baked images of the pool, each from an instance of the Fedora image, a second apart.

    moto_bake.py ENDPOINT REGION < spec.json -> JSON: {"bucket", "olderImages": [oldest first], "snapshots": {image: [...]}}
"""

import json
import sys
import time

import boto3


def main(endpoint, region):
    spec = json.load(sys.stdin)
    kw = dict(region_name=region, endpoint_url=endpoint, aws_access_key_id="test", aws_secret_access_key="test")
    ec2, s3, iam = (boto3.client(s, **kw) for s in ("ec2", "s3", "iam"))
    cluster, pool = spec["cluster"], spec["pool"]
    tag = lambda k, v: {"Key": k, "Value": v}
    vpc = ec2.create_vpc(CidrBlock="10.200.0.0/16")["Vpc"]["VpcId"]
    for i, zone in enumerate(spec["zones"]):
        sn = ec2.create_subnet(VpcId=vpc, CidrBlock=f"10.200.{i}.0/24", AvailabilityZone=zone)["Subnet"]["SubnetId"]
        ec2.create_tags(Resources=[sn], Tags=[tag("Name", f"{cluster}-subnet-{zone}"), tag("dynk8s:cluster", cluster)])
    sg = ec2.create_security_group(GroupName=f"{cluster}-node-sg", Description="nodes", VpcId=vpc)["GroupId"]
    ec2.create_tags(Resources=[sg], Tags=[tag("Name", f"{cluster}-node-sg"), tag("dynk8s:cluster", cluster)])
    iam.create_instance_profile(InstanceProfileName=spec["profile"], Path="/dynk8s/")

    bucket = spec["bucketPrefix"] + "e2e000001"
    s3.create_bucket(Bucket=bucket, CreateBucketConfiguration={"LocationConstraint": region})
    s3.put_bucket_tagging(Bucket=bucket, Tagging={"TagSet": [tag("dynk8s:cluster", cluster)]})
    s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    s3.put_object(Bucket=bucket, Key=spec["agentKey"], Body=b"agent", Metadata={"sha256": spec["agentSHA256"]})
    # Another stack's bucket of the same prefix, which the bake must not take.
    s3.create_bucket(Bucket=spec["bucketPrefix"] + "other00001", CreateBucketConfiguration={"LocationConstraint": region})
    s3.put_bucket_tagging(Bucket=spec["bucketPrefix"] + "other00001", Tagging={"TagSet": [tag("dynk8s:cluster", "other")]})

    older, snaps = [], {}
    for n in range(spec["older"]):
        inst = ec2.run_instances(ImageId=spec["fedoraImage"], InstanceType="c7i.large", MinCount=1, MaxCount=1)
        iid = inst["Instances"][0]["InstanceId"]
        image = ec2.create_image(InstanceId=iid, Name=f"{cluster}-{pool}-old{n}", TagSpecifications=[{
            "ResourceType": "image", "Tags": [tag("dynk8s:cluster", cluster), tag("dynk8s:pool", pool),
                                              tag("dynk8s:bake-sha256", f"{n:064x}")]}])["ImageId"]
        ec2.terminate_instances(InstanceIds=[iid])
        desc = ec2.describe_images(ImageIds=[image])["Images"][0]
        snaps[image] = [m["Ebs"]["SnapshotId"] for m in desc.get("BlockDeviceMappings", []) if "Ebs" in m]
        older.append(image)
        time.sleep(1.1)  # CreationDate has a second's resolution: the bake orders by it
    json.dump({"bucket": bucket, "olderImages": older, "snapshots": snaps}, sys.stdout)


if __name__ == "__main__":
    main(*sys.argv[1:])
