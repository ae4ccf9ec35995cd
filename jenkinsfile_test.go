package main

import (
	"regexp"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
)

// jenkinsStages splits the Jenkinsfile's pipeline into its stages, by name.
func jenkinsStages(t *testing.T, jenkinsfile string) map[string]string {
	t.Helper()
	pipeline := jenkinsfile[:strings.Index(jenkinsfile, "\ndef ")]
	starts := regexp.MustCompile(`stage\('([^']+)'\)`).FindAllStringSubmatchIndex(pipeline, -1)
	stages := map[string]string{}
	for i, m := range starts {
		end := len(pipeline)
		if i+1 < len(starts) {
			end = starts[i+1][0]
		}
		stages[pipeline[m[2]:m[3]]] = pipeline[m[0]:end]
	}
	assert.Assert(t, len(stages) >= 4, "no stages found in the Jenkinsfile")
	return stages
}

// TestJenkinsNeverHandsCredentialsToUnreviewedCode: no credential is in the pipeline's
// environment, where `make test` (a branch's or a pull request's own code) would read it; each is bound with
// withCredentials only in a stage that runs on main; every stage that runs pulumi runs on main only; and `pulumi
// up` runs only after the preview gate (cmd/previewgate, review M9), whose -allow comes from the approver; a bake
// (cmd/bake) runs only after the approval.
func TestJenkinsNeverHandsCredentialsToUnreviewedCode(t *testing.T) {
	jenkinsfile := readFile(t, "Jenkinsfile")
	assert.Check(t, !strings.Contains(jenkinsfile, "credentials("),
		"credentials(...) in an environment block puts a secret into every step of the pipeline or stage")
	onMain := "when { branch 'main' }"
	for name, stage := range jenkinsStages(t, jenkinsfile) {
		for _, needsMain := range []string{"withCredentials", "pulumi ", "input("} {
			if strings.Contains(stage, needsMain) {
				assert.Check(t, strings.Contains(stage, onMain), "stage %s uses %s on any branch", name, needsMain)
			}
		}
	}
	stages := jenkinsStages(t, jenkinsfile)
	assert.Check(t, is.Contains(stages["Test"], "sh 'make test'"))
	assert.Check(t, !strings.Contains(stages["Test"]+stages["Build"]+stages["Plan"], "withCredentials"))

	up := stages["Up"]
	gate := strings.Index(up, "build/previewgate -allow=\"$ALLOW_TUNNEL_OUTAGE\"")
	apply := strings.Index(up, "pulumi up ")
	assert.Check(t, gate > 0 && apply > gate, "pulumi up must run after the preview gate, with the approver's -allow")
	assert.Check(t, is.Contains(stages["Approve"], "booleanParam(name: 'ALLOW_TUNNEL_OUTAGE', defaultValue: false"))
	// A bake bills an instance: it runs after the approval, for the approved stack, before its preview; before
	// the approval the images are only checked (cmd/bake -check), and a stack missing one skips its preview.
	bake := strings.Index(up, `build/bake -stack "$DEPLOY_STACK"`)
	assert.Check(t, bake > 0 && bake < gate, "the approved stack's bake must run before its preview and up")
	preview := stages["Preview"]
	check, previewed := strings.Index(preview, "build/bake -stack ${stack} -check"), strings.Index(preview, "pulumi preview")
	assert.Check(t, check > 0 && previewed > check, "the preview must check the baked images first")
	assert.Check(t, !strings.Contains(preview, "build/bake -stack ${stack}\""), "a bake runs before the approval")
	assert.Check(t, is.Contains(stages["Build"], "go build -o build/bake ./cmd/bake"))

	// The bindings name every variable the deploy needs, so no stage falls back to a credential in the environment.
	binding := jenkinsfile[strings.Index(jenkinsfile, "def deployCredentials()"):]
	for _, v := range []string{"PULUMI_BACKEND_URL", "PULUMI_CONFIG_PASSPHRASE", "KUBECONFIG", "AmazonWebServicesCredentialsBinding"} {
		assert.Check(t, is.Contains(binding, v))
	}
}

// TestJenkinsApprovalHoldsNoAgent: the pipeline takes no agent for the whole run, the stages that run code take a
// pod of ci/jenkins-agent.yaml each, and the approval takes none: a pending approval holds no pod, and no code
// stage's timeout runs while it waits. `up` applies the program the preview saw (stashed, then unstashed).
func TestJenkinsApprovalHoldsNoAgent(t *testing.T) {
	jenkinsfile := readFile(t, "Jenkinsfile")
	pipeline := jenkinsfile[:strings.Index(jenkinsfile, "\ndef ")]
	assert.Check(t, is.Contains(pipeline[:strings.Index(pipeline, "stages {")], "agent none"))
	stages := jenkinsStages(t, jenkinsfile)
	approve := stages["Approve"]
	assert.Check(t, is.Contains(approve, "input("))
	assert.Check(t, !regexp.MustCompile(`agent\s*(\{|any\b)`).MatchString(approve), "the approval takes an agent")
	assert.Check(t, !strings.Contains(approve, "sh "), "the approval runs a command, which needs an agent")
	for _, name := range []string{"Check", "Up"} {
		assert.Check(t, is.Contains(stages[name], "yamlFile 'ci/jenkins-agent.yaml'"), "stage %s", name)
		assert.Check(t, is.Contains(stages[name], "timeout("), "stage %s has no timeout of its own", name)
	}
	assert.Check(t, is.Contains(stages["Preview"], "stash name: 'build', includes: 'build/**'"))
	up := stages["Up"]
	unstash, apply := strings.Index(up, "unstash 'build'"), strings.Index(up, "pulumi up ")
	assert.Check(t, unstash > 0 && apply > unstash, "up must unstash the previewed program first")
}
