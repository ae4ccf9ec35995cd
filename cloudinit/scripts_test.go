package cloudinit

// embeddedScripts names every embedded script by its file name.
func embeddedScripts() map[string]string {
	return map[string]string{"fetch-agent.sh": fetchAgentSh}
}
