package mockcloud

import (
	"github.com/pulumi/pulumi/sdk/v3/go/common/resource"
	"github.com/pulumi/pulumi/sdk/v3/go/common/tokens"
	pulumirpc "github.com/pulumi/pulumi/sdk/v3/proto/go"
)

// childURN is the URN of a resource of type typ named name under the parent parentURN, as the engine builds it: the
// parent's qualified type leads the type, unless the parent is the stack itself (or there is none).
func childURN(parentURN, typ, name string) string {
	parent := resource.URN(parentURN)
	parentType := tokens.Type("")
	if parent != "" && parent.QualifiedType() != resource.RootStackType {
		parentType = parent.QualifiedType()
	}
	stack, project := tokens.QName(""), tokens.PackageName(Project)
	if parent != "" {
		stack, project = parent.Stack(), parent.Project()
	}
	return string(resource.NewURN(stack, project, parentType, tokens.Type(typ), name))
}

// aliasURNs resolves a registration's aliases to URNs. A spec's unset name or type is the resource's own, its unset
// parent the resource's parent, and noParent the stack (Pulumi docs, "Resource options: aliases").
func aliasURNs(parentURN, typ, name string, aliases []*pulumirpc.Alias) []string {
	var out []string
	for _, a := range aliases {
		if urn := a.GetUrn(); urn != "" {
			out = append(out, urn)
			continue
		}
		spec := a.GetSpec()
		if spec == nil {
			continue
		}
		aliasName, aliasType, aliasParent := name, typ, parentURN
		if spec.GetName() != "" {
			aliasName = spec.GetName()
		}
		if spec.GetType() != "" {
			aliasType = spec.GetType()
		}
		switch {
		case spec.GetNoParent():
			aliasParent = rootURN(parentURN)
		case spec.GetParentUrn() != "":
			aliasParent = spec.GetParentUrn()
		}
		out = append(out, childURN(aliasParent, aliasType, aliasName))
	}
	return out
}

// rootURN is the stack's own URN, read from any URN of the stack.
func rootURN(urn string) string {
	u := resource.URN(urn)
	if u == "" {
		return ""
	}
	return string(resource.NewURN(u.Stack(), u.Project(), "",
		resource.RootStackType, string(u.Project())+"-"+string(u.Stack())))
}

// AcceptedURNs maps every URN an earlier deployment may hold to the declared resource that takes it over in place:
// its own URN, its aliases, and the URNs it inherits from its parent's aliases (the engine gives a child of an
// aliased parent the alias under each of the parent's old URNs). Resources read from the cloud are left out: state
// holds them, but reading again never replaces anything.
func (c *Cloud) AcceptedURNs() map[string]string {
	declared := map[string]Resource{}
	for _, r := range c.Resources() {
		if !r.Read && r.URN != "" {
			declared[r.URN] = r
		}
	}
	memo := map[string][]string{}
	var accepted func(urn string) []string
	accepted = func(urn string) []string {
		if got, ok := memo[urn]; ok {
			return got
		}
		r, ok := declared[urn]
		if !ok {
			return []string{urn}
		}
		own := append([]string{r.URN}, r.Aliases...)
		if r.ParentURN != "" {
			if _, parentDeclared := declared[r.ParentURN]; parentDeclared {
				for _, old := range accepted(r.ParentURN)[1:] {
					own = append(own, childURN(old, r.Type, r.Name))
				}
			}
		}
		memo[urn] = own
		return own
	}
	out := map[string]string{}
	for urn := range declared {
		for _, old := range accepted(urn) {
			out[old] = urn
		}
	}
	return out
}
