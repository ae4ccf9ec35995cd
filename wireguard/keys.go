// Package wireguard derives WireGuard keys and renders wg-quick(8) configuration files from Go types.
//
// It is pure Go with no Pulumi types, so the stack can feed it plain values inside one ApplyT and the tests can
// check it against the real wireguard-tools without the engine.
package wireguard

import (
	"encoding/base64"
	"fmt"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// keyLen is the size of a Curve25519 key; its standard base64 form is always 44 characters.
const keyLen = wgtypes.KeyLen

// PublicKey derives the base64 public key from a base64 private key (32 bytes).
func PublicKey(privateKey string) (string, error) {
	if err := ValidateKey(privateKey); err != nil {
		return "", fmt.Errorf("private key: %w", err)
	}
	k, err := wgtypes.ParseKey(privateKey)
	if err != nil {
		return "", fmt.Errorf("private key: %w", err)
	}
	return k.PublicKey().String(), nil
}

// PrivateKeyFromBytes clamps 32 random bytes (given base64, e.g. from pulumi-random RandomBytes.Base64) into a
// WireGuard private key, as `wg genkey` does, and returns it base64.
//
// Clamping here rather than relying on Curve25519 to clamp at use time keeps the stored private key identical to
// what `wg genkey` would have printed, so a key copied out of the stack into `wg` tooling round-trips unchanged.
func PrivateKeyFromBytes(randomBase64 string) (string, error) {
	b, err := decodeKey(randomBase64)
	if err != nil {
		return "", fmt.Errorf("random bytes: %w", err)
	}
	b[0] &= 248
	b[31] &= 127
	b[31] |= 64
	return base64.StdEncoding.EncodeToString(b), nil
}

// ValidateKey reports whether s is 32 bytes of standard base64 (44 chars).
func ValidateKey(s string) error {
	_, err := decodeKey(s)
	return err
}

func decodeKey(s string) ([]byte, error) {
	if s == "" {
		return nil, fmt.Errorf("key is empty, want %d bytes of standard base64", keyLen)
	}
	if want := base64.StdEncoding.EncodedLen(keyLen); len(s) != want {
		return nil, fmt.Errorf("key is %d characters, want %d (%d bytes of standard base64)", len(s), want, keyLen)
	}
	// Strict rejects non-zero padding bits, which wg(8) also refuses; otherwise two spellings would name one key.
	b, err := base64.StdEncoding.Strict().DecodeString(s)
	if err != nil {
		return nil, fmt.Errorf("key is not standard base64: %w", err)
	}
	if len(b) != keyLen {
		return nil, fmt.Errorf("key decodes to %d bytes, want %d", len(b), keyLen)
	}
	return b, nil
}
