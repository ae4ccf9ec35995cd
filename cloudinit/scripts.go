package cloudinit

import _ "embed"

// The bootstrap is a real file so that shellcheck reads it and the shebang stays on line 1.
var (
	//go:embed scripts/fetch-agent.sh
	fetchAgentSh string
)
