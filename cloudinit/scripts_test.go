package cloudinit

// embeddedScripts names every embedded script by its file name, as shellcheck -x resolves "source lib.sh".
func embeddedScripts() map[string]string {
	return map[string]string{"lib.sh": libSh, "aws.sh": awsSh, "wg-key.sh": wgKeySh,
		"gateway-idle.sh": gatewayIdleSh, "gateway-packages.sh": gatewayPackagesSh, "fetch-agent.sh": fetchAgentSh}
}
