package fakeaws

import (
	"encoding/json"
	"net/http"
	"slices"
	"testing"
)

// SSM is a stand-in for Systems Manager's Parameter Store as dynk8s uses it, over its JSON API (AWS JSON 1.1, the
// action in X-Amz-Target): GetParameter of SecureStrings with decryption (the join token, the gateway's key) and
// PutParameter (the token rotator).
type SSM struct {
	server
	params   map[string]ssmParameter
	failures int
	failCode string
	puts     []SSMPut
}

type ssmParameter struct {
	value   string
	version int
}

// SSMPut is a PutParameter request as the fake was sent it.
type SSMPut struct {
	Name      string
	Value     string
	Type      string
	KeyID     string `json:"KeyId"`
	Overwrite bool
}

// ssmJSON is the JSON protocol's content type, for requests and answers.
const ssmJSON = "application/x-amz-json-1.1"

// NewSSM starts an SSM that takes requests signed with sig; it stops, and reports its problems, when t ends.
func NewSSM(t testing.TB, sig SigV4) *SSM {
	t.Helper()
	s := &SSM{params: map[string]ssmParameter{}}
	s.start(t, "SSM", "ssm", sig, func(w http.ResponseWriter, err error) {
		s.fail(w, http.StatusBadRequest, "InvalidSignatureException", err.Error())
	}, s.serve)
	return s
}

// SetParameter stores a SecureString, as a new version of it.
func (s *SSM) SetParameter(name, value string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.put(name, value)
}

// Fail answers the next n calls (every call: n < 0; none: 0) with HTTP 400 and the error code (e.g.
// AccessDeniedException), message "fake SSM says no".
func (s *SSM) Fail(n int, code string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failures, s.failCode = n, code
}

// Puts are the PutParameter requests so far, in order, answered or not.
func (s *SSM) Puts() []SSMPut {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.puts)
}

func (s *SSM) put(name, value string) int {
	p := s.params[name]
	p.value, p.version = value, p.version+1
	s.params[name] = p
	return p.version
}

func (s *SSM) serve(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.Header.Get("Content-Type") != ssmJSON {
		s.problemf("%s with content type %q", r.Method, r.Header.Get("Content-Type"))
	}
	target := r.Header.Get("X-Amz-Target")
	var req struct {
		Name           string
		WithDecryption bool
		SSMPut
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.Name == "" {
		s.problemf("%s: request %+v (%v): no parameter name", target, req, err)
	}
	if target == "AmazonSSM.PutParameter" {
		req.SSMPut.Name = req.Name
		s.puts = append(s.puts, req.SSMPut)
	}
	if s.failures != 0 {
		s.failures--
		s.fail(w, http.StatusBadRequest, s.failCode, "fake SSM says no")
		return
	}
	switch target {
	case "AmazonSSM.GetParameter":
		p, ok := s.params[req.Name]
		if !ok {
			s.fail(w, http.StatusBadRequest, "ParameterNotFound", "") // SSM says no more
			return
		}
		if !req.WithDecryption {
			s.problemf("GetParameter %s without WithDecryption: SSM answers a SecureString's ciphertext", req.Name)
		}
		s.answer(w, map[string]any{"Parameter": map[string]any{"Name": req.Name, "Type": "SecureString",
			"Value": p.value, "Version": p.version, "DataType": "text"}})
	case "AmazonSSM.PutParameter":
		if _, exists := s.params[req.Name]; exists && !req.Overwrite {
			s.fail(w, http.StatusBadRequest, "ParameterAlreadyExists", "The parameter already exists.")
			return
		}
		s.answer(w, map[string]any{"Tier": "Standard", "Version": s.put(req.Name, req.Value)})
	default:
		s.problemf("unexpected target %q", target)
		s.fail(w, http.StatusBadRequest, "UnknownOperationException", "")
	}
}

func (s *SSM) answer(w http.ResponseWriter, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		s.problemf("answer: %v", err)
	}
	w.Header().Set("Content-Type", ssmJSON)
	_, _ = w.Write(b)
}

// fail answers as the JSON protocol does: the code in __type, the message beside it.
func (s *SSM) fail(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", ssmJSON)
	w.WriteHeader(status)
	doc := map[string]string{"__type": code}
	if msg != "" {
		doc["message"] = msg
	}
	b, _ := json.Marshal(doc)
	_, _ = w.Write(b)
}
