package fakeaws

import (
	"encoding/json"
	"io"
	"net/http"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
)

// IMDSSessionToken is the IMDSv2 session token the server hands out and requires.
const IMDSSessionToken = "AQAEAFakeImdsToken-0123=="

// IMDSInstance is what the server answers.
type IMDSInstance struct {
	ID, Zone, Region, PrivateIP, Type string
	// Role is the instance profile's role name; AccessKeyID, SecretAccessKey and SessionToken its credentials.
	Role, AccessKeyID, SecretAccessKey, SessionToken string
	// Domain is the partition's DNS suffix (meta-data/services/domain); empty: amazonaws.com.
	Domain string
	// LifecycleState is the Auto Scaling target lifecycle state (meta-data/autoscaling/target-lifecycle-state);
	// empty: the path is absent (404), as for an instance outside any group.
	LifecycleState string
}

// NodeInstance is the instance the fakes describe unless a test needs another: an arm64 pool node in eu-central-1,
// with its role's temporary credentials.
func NodeInstance() IMDSInstance {
	return IMDSInstance{ID: "i-0123456789abcdef0", Zone: "eu-central-1a", Region: "eu-central-1",
		PrivateIP: "10.100.1.23", Type: "m7g.large", Role: "dynk8s-node", AccessKeyID: "AKIAFAKEACCESSKEY01",
		SecretAccessKey: "fakeSecret/Key+0123456789abcdefghijklmn", SessionToken: "FwoGZXIvYXdzEFAKE/session+token=="}
}

// SigV4 is what the instance's role signs with: its credentials, in its region.
func (inst IMDSInstance) SigV4() SigV4 {
	return SigV4{Region: inst.Region, Credentials: aws.Credentials{AccessKeyID: inst.AccessKeyID,
		SecretAccessKey: inst.SecretAccessKey, SessionToken: inst.SessionToken}}
}

// lifecyclePath is where IMDS has the Auto Scaling target lifecycle state: "the state it is transitioning to"
// (InService, Warmed:Stopped, ...), per the EC2 Auto Scaling user guide, "Retrieve the target lifecycle state through
// instance metadata".
const lifecyclePath = "/latest/meta-data/autoscaling/target-lifecycle-state"

// IMDS is a loopback stand-in for the EC2 instance metadata service as dynk8s instances have it: IMDSv2 only (every
// read needs a session token from PUT /latest/api/token), serving the identity paths and the instance role's
// credentials that the node agent and the bootstrap read. Tests point them at it with DYNK8S_IMDS_ENDPOINT.
// Requests that break the IMDSv2 rules are answered as the real service does and
// reported as test errors when the test ends.
type IMDS struct {
	server
	values        map[string]string
	tokenFailures int
}

// NewIMDS starts a server for inst; it stops, and reports its problems, when t ends.
func NewIMDS(t testing.TB, inst IMDSInstance) *IMDS {
	t.Helper()
	creds, err := json.Marshal(map[string]string{
		"Code": "Success", "Type": "AWS-HMAC", "AccessKeyId": inst.AccessKeyID,
		"SecretAccessKey": inst.SecretAccessKey, "Token": inst.SessionToken, "Expiration": "2030-01-01T00:00:00Z",
	})
	if err != nil {
		t.Fatal(err)
	}
	s := &IMDS{values: map[string]string{
		"/latest/meta-data/instance-id":                           inst.ID,
		"/latest/meta-data/placement/availability-zone":           inst.Zone,
		"/latest/meta-data/placement/region":                      inst.Region,
		"/latest/meta-data/local-ipv4":                            inst.PrivateIP,
		"/latest/meta-data/instance-type":                         inst.Type,
		"/latest/meta-data/iam/security-credentials/":             inst.Role,
		"/latest/meta-data/iam/security-credentials/" + inst.Role: string(creds),
		"/latest/meta-data/services/domain":                       inst.Domain,
	}}
	if inst.Domain == "" {
		s.values["/latest/meta-data/services/domain"] = "amazonaws.com"
	}
	if inst.LifecycleState != "" {
		s.values[lifecyclePath] = inst.LifecycleState
	}
	s.start(t, "IMDS", "", SigV4{}, nil, s.serve)
	return s
}

// FailTokens makes the next n token requests fail with 503, as a metadata service still starting up does.
func (s *IMDS) FailTokens(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.tokenFailures = n
}

// SetLifecycleState changes the target lifecycle state, as the group does when it moves a warm instance into
// service; empty removes the path.
func (s *IMDS) SetLifecycleState(state string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if state == "" {
		delete(s.values, lifecyclePath)
		return
	}
	s.values[lifecyclePath] = state
}

func (s *IMDS) serve(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/latest/api/token" {
		if r.Method != http.MethodPut || r.Header.Get("X-aws-ec2-metadata-token-ttl-seconds") == "" {
			s.problemf("token request %s without a TTL header", r.Method)
			http.Error(w, "bad request", http.StatusBadRequest)
			return
		}
		if s.tokenFailures > 0 {
			s.tokenFailures--
			http.Error(w, "unavailable", http.StatusServiceUnavailable)
			return
		}
		// As IMDS answers: the token's TTL in seconds, which the AWS SDKs read to know when to renew it.
		w.Header().Set("X-Aws-Ec2-Metadata-Token-Ttl-Seconds", r.Header.Get("X-aws-ec2-metadata-token-ttl-seconds"))
		_, _ = io.WriteString(w, IMDSSessionToken)
		return
	}
	if r.Header.Get("X-aws-ec2-metadata-token") != IMDSSessionToken {
		s.problemf("%s without the session token (IMDSv1 is off on dynk8s instances)", r.URL.Path)
		http.Error(w, "unauthorized", http.StatusUnauthorized)
		return
	}
	v, ok := s.values[r.URL.Path]
	if !ok {
		http.NotFound(w, r)
		return
	}
	_, _ = io.WriteString(w, v)
}
