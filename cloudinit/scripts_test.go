package cloudinit

// embeddedScripts names every embedded script by its file name, as shellcheck -x resolves "source lib.sh".
func embeddedScripts() map[string]string {
	return map[string]string{"lib.sh": libSh, "onprem-routes.sh": onpremRoutesSh, "imds-lock.sh": imdsLockSh,
		"fetch-agent.sh": fetchAgentSh}
}
