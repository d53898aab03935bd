package mirror

import (
	"regexp"
	"strings"
	"testing"
)

// validKey is what NATS KV takes as a key (nats.go's keyValid).
var validKey = regexp.MustCompile(`^[-/_=\.a-zA-Z0-9]+$`)

func TestKeyRoundTrip(t *testing.T) {
	name253 := strings.Repeat("a", 61) + "." + strings.Repeat("b", 63) + "." + strings.Repeat("c", 63) + "." + strings.Repeat("d", 63)
	ns63 := strings.Repeat("n", 63)
	for _, c := range []struct{ ns, name, key string }{
		{"default", "web", "default.web"},
		{"", "node-1", "_.node-1"},
		{"kube-system", "coredns.v1", "kube-system.coredns=2Ev1"},
		{"a", "x:y_z=w", "a.x=3Ay=5Fz=3Dw"},
		{"a", "ñ", "a.=C3=B1"},
		{"a", "日本", "a.=E6=97=A5=E6=9C=AC"},
		{"a", "_kubebridge.compacted", "a.=5Fkubebridge=2Ecompacted"},
		{"", "_kubebridge.compacted", "_.=5Fkubebridge=2Ecompacted"},
		{"_", "x", "=5F.x"},
		{ns63, name253, ""},
		{"a", "UPPER-lower-09", "a.UPPER-lower-09"},
	} {
		k := Key(c.ns, c.name)
		if c.key != "" && k != c.key {
			t.Errorf("Key(%q, %q) = %q, want %q", c.ns, c.name, k, c.key)
		}
		if !validKey.MatchString(k) || strings.HasPrefix(k, ReservedPrefix) || len(k) > MaxKeyLen {
			t.Errorf("Key(%q, %q) = %q: not a valid, unreserved key", c.ns, c.name, k)
		}
		ns, name, hashed, err := ParseKey(k)
		if err != nil || hashed || ns != c.ns || name != c.name {
			t.Errorf("ParseKey(%q) = %q, %q, %v, %v; want %q, %q", k, ns, name, hashed, err, c.ns, c.name)
		}
	}
	// A 253-byte name of multi-byte characters still fits, unhashed.
	wide := strings.Repeat("é", 126)
	if k := Key(ns63, wide); strings.Contains(k, HashedPrefix) {
		t.Errorf("Key of a 252-byte name is hashed: %s", k)
	}
}

func TestKeyHashesLongNames(t *testing.T) {
	long := strings.Repeat("x.", 400)
	k := Key("ns", long)
	if !strings.HasPrefix(k, "ns."+HashedPrefix) || len(k) != len("ns.")+len(HashedPrefix)+64 {
		t.Fatalf("Key of an 800-byte name = %q", k)
	}
	ns, name, hashed, err := ParseKey(k)
	if err != nil || !hashed || ns != "ns" || name != "" {
		t.Fatalf("ParseKey(%q) = %q, %q, %v, %v", k, ns, name, hashed, err)
	}
	if Key("ns", long+"y") == k {
		t.Error("two names, one hash")
	}
}

func TestParseKeyRefuses(t *testing.T) {
	for key, why := range map[string]string{
		CompactedKey:                 "the bridge's own",
		ReservedPrefix + "anything":  "the bridge's own",
		"":                           "not <namespace>.<name>",
		"nodot":                      "not <namespace>.<name>",
		".name":                      "not <namespace>.<name>",
		"ns.":                        "not <namespace>.<name>",
		"ns.a.b":                     "not <namespace>.<name>",
		"ns.=2D":                     "bad escape", // "-" needs none: one spelling per name
		"ns.=61":                     "bad escape", // "a"
		"ns.=2e":                     "bad escape", // lower-case hex
		"ns.a=2":                     "bad escape", // cut short
		"ns.a=":                      "bad escape",
		"ns.a_b":                     "bad escape", // "_" is escaped
		"n_s.a":                      "bad escape",
		"ns.a/b":                     "bad escape",
		"ns." + HashedPrefix + "abc": "hashed name",
		"ns." + HashedPrefix + strings.Repeat("A", 64): "hashed name",
		"ns." + strings.Repeat("a", MaxKeyLen):         "longer than",
	} {
		_, _, _, err := ParseKey(key)
		if err == nil || !strings.Contains(err.Error(), why) {
			t.Errorf("ParseKey(%.40q) = %v, want an error saying %q", key, err, why)
		}
	}
}

// Every key Key makes is a valid KV key that parses back to its object
// (or its hash); every key ParseKey takes is the one Key makes.
func FuzzKey(f *testing.F) {
	f.Add("default", "web")
	f.Add("", "a.b")
	f.Add("ns", "ñ=_:.")
	f.Add("ns", strings.Repeat("z", 1100))
	f.Fuzz(func(t *testing.T, ns, name string) {
		if name == "" {
			return
		}
		k := Key(ns, name)
		if !validKey.MatchString(k) || strings.HasPrefix(k, ReservedPrefix) {
			t.Fatalf("Key(%q, %q) = %q: not a valid, unreserved key", ns, name, k)
		}
		gns, gname, hashed, err := ParseKey(k)
		if err != nil {
			t.Fatalf("ParseKey(Key(%q, %q) = %q): %v", ns, name, k, err)
		}
		if gns != ns || (!hashed && gname != name) || (hashed && gname != "") {
			t.Fatalf("ParseKey(%q) = %q, %q, %v; want %q, %q", k, gns, gname, hashed, ns, name)
		}
	})
}

func FuzzParseKey(f *testing.F) {
	for _, k := range []string{"default.web", "_.n", "a.=C3=B1", CompactedKey, "ns." + HashedPrefix + strings.Repeat("0", 64), "a.=2D", "a.b.c"} {
		f.Add(k)
	}
	f.Fuzz(func(t *testing.T, key string) {
		ns, name, hashed, err := ParseKey(key)
		if err != nil {
			return
		}
		if hashed {
			if !strings.HasPrefix(key, Key(ns, "x")[:len(Key(ns, "x"))-1]+HashedPrefix) {
				t.Fatalf("ParseKey(%q): hashed in namespace %q", key, ns)
			}
			return
		}
		if k := Key(ns, name); k != key {
			t.Fatalf("ParseKey(%q) = %q, %q, but Key spells it %q", key, ns, name, k)
		}
	})
}
