package cloudinit

import (
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/dynk8s/dynk8s/internal/kube"
	"github.com/dynk8s/dynk8s/internal/names"
)

var (
	// ssmNameRE is SSM's parameter-name alphabet; the agent reads the name from node.json.
	ssmNameRE = regexp.MustCompile(`^[A-Za-z0-9_./-]+$`)

	// tokenLikeRE finds a kubeadm bootstrap token inside any string.
	tokenLikeRE = regexp.MustCompile(`(^|[^a-z0-9])` + names.BootstrapTokenPattern + `([^a-z0-9]|$)`)
	// keyLikeRE finds a WireGuard key inside any string, even after a '/'.
	keyLikeRE = regexp.MustCompile(names.WireGuardKeyPattern)
)

// errs collects validation problems, each prefixed with the input field it is about.
type errs []error

func (e *errs) add(field string, err error) {
	if err != nil {
		*e = append(*e, fmt.Errorf("%s: %w", field, err))
	}
}

func (e errs) join(what string) error {
	if len(e) == 0 {
		return nil
	}
	return fmt.Errorf("%s: %w", what, errors.Join(e...))
}

// noSecret refuses a value that looks like a bootstrap token or a WireGuard key: everything rendered is public (user
// data can be read by anyone with ec2:DescribeInstanceAttribute), so such a value is a wiring mistake, and the error
// does not repeat it.
func noSecret(s string) error {
	switch {
	case tokenLikeRE.MatchString(s):
		return errors.New("looks like a bootstrap token; user data is public, pass the SSM parameter name instead")
	case keyLikeRE.MatchString(s):
		return errors.New("looks like a WireGuard key; user data is public, pass the SSM parameter name instead")
	}
	return nil
}

func validateDNSLabel(s string) error {
	if !kube.IsDNSLabel(s) {
		return fmt.Errorf("%q is not a DNS label (lower-case letters, digits, '-', at most 63)", s)
	}
	return nil
}

func validateSSMName(s string) error {
	if err := noSecret(s); err != nil {
		return err
	}
	if !ssmNameRE.MatchString(s) || len(s) > 1011 {
		return fmt.Errorf("%q is not an SSM parameter name ([A-Za-z0-9_.-/], 1 to 1011 characters)", s)
	}
	first := strings.ToLower(strings.TrimPrefix(s, "/"))
	if strings.HasPrefix(first, "aws") || strings.HasPrefix(first, "ssm") {
		return fmt.Errorf("%q: SSM reserves names starting with aws or ssm", s)
	}
	return nil
}
