package mirror

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
)

// ClusterScoped is the namespace token of cluster-scoped objects'
// keys: no namespace is "_" (namespaces are DNS labels).
const ClusterScoped = "_"

// ReservedPrefix starts the keys the bridge keeps for itself in a mirror
// bucket (CompactedKey); no object's key starts with it, since no
// namespace holds an underscore. Consumers skip them.
const ReservedPrefix = "_kubebridge."

// CompactedKey holds, as a decimal revision, how far deletion markers have
// been compacted away: a watch resumed from a revision below it may have
// missed a deletion, so it must list again (410 Gone).
const CompactedKey = ReservedPrefix + "compacted"

// MaxKeyLen bounds a key. Kubernetes names are at most 253 bytes (63 for
// a namespace), which escape to at most 3 bytes each: every real key fits.
// A longer name (an API that does not bound its names) is keyed by its
// hash (HashedPrefix), and only the value says which object it is.
const MaxKeyLen = 1024

// HashedPrefix starts the name token of a name too long for a key, which
// is followed by the hex SHA-256 of the name.
const HashedPrefix = "=H"

// Key returns the bucket key of the object namespace/name (namespace ""
// for cluster-scoped objects): <namespace>.<name>, each escaped: letters,
// digits and "-" stay as they are, every other byte (".", ":", "_", "=",
// the bytes of a multi-byte character) is "=" and two upper-case hex
// digits. So a key is one token per part, subject wildcards select by
// namespace ("team-a.>"), and ParseKey reverses it.
func Key(namespace, name string) string {
	ns := ClusterScoped
	if namespace != "" {
		ns = escape(namespace)
	}
	k := ns + "." + escape(name)
	if len(k) > MaxKeyLen {
		sum := sha256.Sum256([]byte(name))
		k = ns + "." + HashedPrefix + hex.EncodeToString(sum[:])
	}
	return k
}

// ParseKey returns the namespace and name of an object key ("" namespace:
// cluster-scoped). hashed is true for a name keyed by its hash (then name
// is "" and the value names the object). Reserved keys are an error.
func ParseKey(key string) (namespace, name string, hashed bool, err error) {
	if strings.HasPrefix(key, ReservedPrefix) {
		return "", "", false, fmt.Errorf("key %q is the bridge's own, not an object's", key)
	}
	nsTok, nameTok, ok := strings.Cut(key, ".")
	if !ok || nsTok == "" || nameTok == "" || strings.Contains(nameTok, ".") {
		return "", "", false, fmt.Errorf("key %q is not <namespace>.<name>", key)
	}
	if nsTok != ClusterScoped {
		if namespace, err = unescape(nsTok); err != nil {
			return "", "", false, fmt.Errorf("key %q: %w", key, err)
		}
	}
	if strings.HasPrefix(nameTok, HashedPrefix) {
		if !hashToken(nameTok[len(HashedPrefix):]) {
			return "", "", false, fmt.Errorf("key %q: a hashed name is %s and 64 lower-case hex digits", key, HashedPrefix)
		}
		return namespace, "", true, nil
	}
	if len(key) > MaxKeyLen {
		return "", "", false, fmt.Errorf("key %q is longer than %d bytes: its name would be hashed", key, MaxKeyLen) // one spelling per name
	}
	if name, err = unescape(nameTok); err != nil {
		return "", "", false, fmt.Errorf("key %q: %w", key, err)
	}
	return namespace, name, false, nil
}

const hexDigits = "0123456789ABCDEF"

// hashToken reports whether s is a hex SHA-256, as Key spells it.
func hashToken(s string) bool {
	if len(s) != 2*sha256.Size {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

func plain(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-'
}

func escape(s string) string {
	n := 0
	for i := 0; i < len(s); i++ {
		if !plain(s[i]) {
			n++
		}
	}
	if n == 0 {
		return s
	}
	b := make([]byte, 0, len(s)+2*n)
	for i := 0; i < len(s); i++ {
		c := s[i]
		if plain(c) {
			b = append(b, c)
			continue
		}
		b = append(b, '=', hexDigits[c>>4], hexDigits[c&15])
	}
	return string(b)
}

var errEscape = errors.New("bad escape")

func unescape(s string) (string, error) {
	if !strings.Contains(s, "=") {
		for i := 0; i < len(s); i++ {
			if !plain(s[i]) {
				return "", errEscape
			}
		}
		return s, nil
	}
	b := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case plain(c):
			b = append(b, c)
		case c == '=' && i+2 < len(s):
			hi, lo := strings.IndexByte(hexDigits, s[i+1]), strings.IndexByte(hexDigits, s[i+2])
			if hi < 0 || lo < 0 {
				return "", errEscape
			}
			d := byte(hi<<4 | lo)
			if plain(d) {
				return "", errEscape // one spelling per name
			}
			b = append(b, d)
			i += 2
		default:
			return "", errEscape
		}
	}
	return string(b), nil
}
