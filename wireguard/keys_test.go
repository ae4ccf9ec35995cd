package wireguard

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
)

// vectors are keys made by the real wireguard-tools (see testdata/README.md), so these tests check this package
// against wg(8), not against itself.
type vectors struct {
	Pairs []struct {
		Private string `json:"private"`
		Public  string `json:"public"`
	} `json:"pairs"`
	Clamp []struct {
		Random  string `json:"random"`
		Clamped string `json:"clamped"`
		Public  string `json:"public"`
	} `json:"clamp"`
}

func loadVectors(t *testing.T) vectors {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "keys.json"))
	assert.NilError(t, err)
	var v vectors
	assert.NilError(t, json.Unmarshal(b, &v))
	assert.Assert(t, len(v.Pairs) > 0 && len(v.Clamp) > 0, "testdata/keys.json has no vectors")
	return v
}

func TestPublicKeyMatchesWgPubkey(t *testing.T) {
	v := loadVectors(t)
	for _, p := range v.Pairs {
		got, err := PublicKey(p.Private)
		assert.NilError(t, err)
		assert.Equal(t, got, p.Public, "public key of %s", p.Private)
	}
}

func TestPrivateKeyFromBytesClampsLikeWgGenkey(t *testing.T) {
	v := loadVectors(t)
	for _, c := range v.Clamp {
		got, err := PrivateKeyFromBytes(c.Random)
		assert.NilError(t, err)
		assert.Equal(t, got, c.Clamped)
		pub, err := PublicKey(got)
		assert.NilError(t, err)
		assert.Equal(t, pub, c.Public)
	}
	// A key from `wg genkey` is already clamped, so clamping must leave it unchanged.
	for _, p := range v.Pairs {
		got, err := PrivateKeyFromBytes(p.Private)
		assert.NilError(t, err)
		assert.Equal(t, got, p.Private)
	}
}

func TestKeyErrors(t *testing.T) {
	good := loadVectors(t).Pairs[0].Private
	for name, tc := range map[string]struct {
		key, want string
	}{
		"empty":           {"", "key is empty"},
		"short":           {good[:40], "key is 40 characters, want 44"},
		"long":            {good + "AAAA", "key is 48 characters, want 44"},
		"url alphabet":    {strings.NewReplacer("/", "_", "+", "-").Replace(good), "not standard base64"},
		"padding bits":    {"MB/dz6lGyFlSzlXGf7Xv4wRQYvZcvcf/6T0BMqxEF2d=", "not standard base64"},
		"33 bytes no pad": {strings.Repeat("A", 44), "decodes to 33 bytes"},
		"space":           {" " + good[1:], "not standard base64"},
	} {
		t.Run(name, func(t *testing.T) {
			err := ValidateKey(tc.key)
			assert.ErrorContains(t, err, tc.want)
			_, err = PublicKey(tc.key)
			assert.Check(t, is.ErrorContains(err, "private key: "))
			_, err = PrivateKeyFromBytes(tc.key)
			assert.Check(t, is.ErrorContains(err, "random bytes: "))
		})
	}
	assert.NilError(t, ValidateKey(good))
}
