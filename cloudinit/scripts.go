package cloudinit

import _ "embed"

// The bootstrap is a real file so that shellcheck reads it and the shebang stays on line 1.
var (
	//go:embed scripts/fetch-agent.sh
	fetchAgentSh string
)

// AgentBootstrap is the bootstrap that installs a pinned binary from the stack's agent bucket
// (scripts/fetch-agent.sh): the node agent on an instance, the controller in its init container.
func AgentBootstrap() string { return fetchAgentSh }
