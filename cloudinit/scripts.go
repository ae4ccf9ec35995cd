package cloudinit

import _ "embed"

// The boot scripts are real files so that shellcheck reads them and the shebang stays on line 1.
var (
	//go:embed scripts/lib.sh
	libSh string
	//go:embed scripts/aws.sh
	awsSh string
	//go:embed scripts/wg-key.sh
	wgKeySh string
	//go:embed scripts/gateway-idle.sh
	gatewayIdleSh string
	//go:embed scripts/gateway-packages.sh
	gatewayPackagesSh string
	//go:embed scripts/fetch-agent.sh
	fetchAgentSh string
)
