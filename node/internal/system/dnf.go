package system

import (
	"errors"
	"fmt"
	"slices"
	"strings"
)

// dnf's failures, as the agent's boot and the gateway's packages command report them: dnf4 and dnf5 wordings alike.

// DNFError is how a dnf command failed: its status and dnf's own reason (DNFReason), permanent where no retry within
// the run can change it (a package that fails its signature check).
func DNFError(cmd string, err error) error {
	ee := (*ExitError)(nil)
	if !errors.As(err, &ee) {
		return err
	}
	msg := fmt.Sprintf("dnf %s exited %d", cmd, ee.Code)
	reason := DNFReason(ee.Tail)
	if reason != "" {
		msg += ": " + reason
	}
	if strings.Contains(reason, "not signed") || strings.Contains(reason, "GPG check FAILED") ||
		strings.Contains(reason, "OpenPGP check for package") {
		return Permanent(errors.New(msg))
	}
	return errors.New(msg)
}

// dnfReasons start the lines in which dnf4 and dnf5 say why a command failed: a spec nothing matches, a repository
// not reached or not configured, a signature or key check, a dependency problem, a command dnf lacks. The rest of
// such a line is dnf's own wording, quoted as it is.
var dnfReasons = []string{
	"No match for argument",              // dnf4, dnf5: a spec nothing matches
	"All matches were filtered out",      // dnf4: `... by exclude filtering for argument: SPEC` (Fedora's build only)
	"Argument '",                         // dnf5: `Argument 'SPEC' matches only excluded packages.` (the same)
	"Error: Unable to find a match",      // dnf4, after either
	"Failed to download metadata",        // dnf5: `... for repository "ID": Usable URL not found`
	"Error: Failed to download metadata", // dnf4: `... for repo 'ID': Cannot download repomd.xml: ...`
	"Error: Unknown repo",                // dnf4: a --repo no .repo file defines
	"No matching repositories for",       // dnf5: the same
	"OpenPGP check for package",          // dnf5: `... has failed: The package is not signed.`
	"Error: GPG check FAILED",            // dnf4
	"Public key for",                     // dnf4: `... is not installed` (a key not imported)
	"Problem",                            // dnf4, dnf5: a dependency problem ("Problem: ..." or "Problem 1: ...")
	"No such command",                    // dnf4: a command it lacks (versionlock without its plugin)
	"Unknown argument",                   // dnf5: the same
}

// DNFReason is dnf's reason in out (the tail of what it wrote): the lines that start as dnfReasons or say a package
// "is not signed" (dnf4), at most three, joined; else dnf's last "Error" line; "" when there is none.
func DNFReason(out string) string {
	var reasons []string
	lastError := ""
	for line := range strings.Lines(out) {
		line = strings.TrimSpace(line)
		if strings.HasPrefix(line, "Error") {
			lastError = line
		}
		reason := strings.HasSuffix(line, " is not signed") || slices.ContainsFunc(dnfReasons, func(r string) bool {
			return strings.HasPrefix(line, r)
		})
		if reason && !slices.Contains(reasons, line) && len(reasons) < 3 {
			reasons = append(reasons, line)
		}
	}
	if len(reasons) == 0 {
		return lastError
	}
	return strings.Join(reasons, "; ")
}

// NoMatch says whether dnf's reason is that a spec matches no package it may take (dnf4 and dnf5 wordings,
// dnfReasons).
func NoMatch(reason string) bool {
	for _, s := range []string{"No match for argument", "Unable to find a match", "filtered out by exclude filtering",
		"matches only excluded packages"} {
		if strings.Contains(reason, s) {
			return true
		}
	}
	return false
}
