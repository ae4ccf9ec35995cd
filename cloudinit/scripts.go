package cloudinit

import _ "embed"

// The boot scripts are real files so that shellcheck reads them and the shebang stays on line 1.
var (
	//go:embed scripts/lib.sh
	libSh string
	//go:embed scripts/onprem-routes.sh
	onpremRoutesSh string
	//go:embed scripts/imds-lock.sh
	imdsLockSh string
	//go:embed scripts/fetch-agent.sh
	fetchAgentSh string
)
