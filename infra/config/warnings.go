package config

import (
	"fmt"
	"time"

	"github.com/dynk8s/dynk8s/internal/kube"
)

// EndOfLifeNotice is how long before a Kubernetes minor's end of life Warnings starts to say so.
const EndOfLifeNotice = 60 * 24 * time.Hour

// The newest Fedora release known here to be past its end of life, and the day it ended (Fedora 42: 2026-05-28,
// four weeks after Fedora 44's release, as Fedora's release life cycle keeps a release); every older one ended
// before it. A newer release's end is not known here, so it is not warned about.
const (
	lastFedoraPastEndOfLife = 42
	lastFedoraEndOfLife     = "2026-05-28"
)

// Warnings are what the operator should read about a valid config on day now, each led by its key path: the pinned
// Kubernetes minor at or near its end of life (kube.Minor.EndOfLife), a Fedora release past its end of life, and an
// on-prem admin kubeconfig stored in the
// clear (secret says whether a key's value is stored as a secret: pulumi.Context.IsConfigSecret under the engine).
func (c *Config) Warnings(now time.Time, secret func(key string) bool) []string {
	var out []string
	v := c.Kubernetes.Version
	if m, err := kube.LookupMinor(v); err == nil {
		if eol, ok := m.EndOfLifeDate(); ok {
			next := fmt.Sprintf("1.%d", m.Minor+1)
			switch {
			case !now.Before(eol):
				out = append(out, fmt.Sprintf("%s:kubernetes.version: Kubernetes 1.%d reached its end of life on %s "+
					"(kubernetes.io/releases): it gets no more patch releases, security fixes included; upgrade the "+
					"cluster and the pin to %s or later", Namespace, m.Minor, m.EndOfLife, next))
			case now.Add(EndOfLifeNotice).After(eol):
				out = append(out, fmt.Sprintf("%s:kubernetes.version: Kubernetes 1.%d reaches its end of life on %s "+
					"(kubernetes.io/releases); plan the upgrade to %s", Namespace, m.Minor, m.EndOfLife, next))
			}
		}
	}
	if r := c.Fedora.Release; r <= lastFedoraPastEndOfLife {
		if eol, _ := time.Parse(time.DateOnly, lastFedoraEndOfLife); !now.Before(eol) {
			when := "on " + lastFedoraEndOfLife
			if r < lastFedoraPastEndOfLife {
				when = fmt.Sprintf("before Fedora %d's, which ended on %s", lastFedoraPastEndOfLife, lastFedoraEndOfLife)
			}
			out = append(out, fmt.Sprintf("%s:fedora.release: Fedora %d reached its end of life %s (Fedora's release "+
				"life cycle: a release is kept until four weeks after the next-but-one is out): its image and packages "+
				"get no more updates, security fixes included; pin %d or later", Namespace, r, when,
				lastFedoraPastEndOfLife+1))
		}
	}
	if key := Namespace + ":kubernetes"; c.Kubernetes.Kubeconfig != nil && secret != nil && !secret(key) {
		out = append(out, fmt.Sprintf("%s.kubeconfig: the on-prem cluster's admin kubeconfig is stored in the clear in "+
			"the stack file; store it encrypted: pulumi config set --secret --path '%s.kubeconfig' < kubeconfig",
			key, key))
	}
	return out
}
