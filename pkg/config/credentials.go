package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
)

// DefaultCredentialDirs are where credential files may be, unless the
// operator says otherwise (bridge run --credential-dirs; the chart passes
// its secret mounts).
var DefaultCredentialDirs = []string{"/etc/kubebridge"}

// forbiddenCredentialDirs hold the pod's own credentials (the service
// account token reads Secrets in clear): never a config's to send away,
// whatever the allowed directories say.
var forbiddenCredentialDirs = []string{"/var/run/secrets", "/run/secrets"}

// CredentialFile is a file a config names for a sink to read and send or
// use as a credential: every key ending in "File" (bearerTokenFile,
// signingSecretFile, credentialsFile, tokenFile, tls.caFile...), and every
// value of a map whose key ends in "Files" (credentialFiles), in any sink
// type's block.
type CredentialFile struct {
	Path string // the config key path, e.g. sinks[0].webhook.bearerTokenFile
	File string
	// Sent says the sink sends the file's content to its destination (a
	// bearerTokenFile, a credentialFiles entry), where the others are only
	// used (a TLS key, NATS credentials, a signing secret): see Sendable.
	Sent bool
}

// CredentialFiles lists the credential files cfg names, in config order.
func CredentialFiles(cfg *Config) []CredentialFile {
	var out []CredentialFile
	for i, s := range cfg.Sinks {
		prefix := fmt.Sprintf("sinks[%d]", i)
		walkFiles(reflect.ValueOf(s), prefix, &out)
		if s.Spec != nil && s.Type != "" {
			walkFiles(reflect.ValueOf(s.Spec), prefix+"."+s.Type, &out)
		}
	}
	return out
}

// walkFiles appends the non-empty string fields of v whose yaml key ends
// in "File".
func walkFiles(v reflect.Value, path string, out *[]CredentialFile) {
	for v.Kind() == reflect.Pointer || v.Kind() == reflect.Interface {
		if v.IsNil() {
			return
		}
		v = v.Elem()
	}
	switch v.Kind() {
	case reflect.Struct:
		t := v.Type()
		for i := range t.NumField() {
			f := t.Field(i)
			key, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
			if !f.IsExported() || key == "-" || key == "" {
				continue
			}
			fv := v.Field(i)
			if fv.Kind() == reflect.String && strings.HasSuffix(key, "File") {
				if fv.String() != "" {
					*out = append(*out, CredentialFile{Path: path + "." + key, File: fv.String(), Sent: sentFiles[key]})
				}
				continue
			}
			// A map of them by name (webhook credentialFiles).
			if fv.Kind() == reflect.Map && fv.Type().Key().Kind() == reflect.String && fv.Type().Elem().Kind() == reflect.String && strings.HasSuffix(key, "Files") {
				keys := fv.MapKeys()
				slices.SortFunc(keys, func(a, b reflect.Value) int { return strings.Compare(a.String(), b.String()) })
				for _, k := range keys {
					if f := fv.MapIndex(k).String(); f != "" {
						*out = append(*out, CredentialFile{Path: JoinKey(path+"."+key, k.String()), File: f, Sent: true})
					}
				}
				continue
			}
			walkFiles(fv, path+"."+key, out)
		}
	case reflect.Slice, reflect.Array:
		for i := range v.Len() {
			walkFiles(v.Index(i), fmt.Sprintf("%s[%d]", path, i), out)
		}
	}
}

// sentFiles are the credential file keys whose contents go to the
// destination as they are (an HTTP bearer token; a NATS token or password
// in CONNECT), so they must be single-line tokens (Sendable), never a file
// the config only uses (a key, a seed).
var sentFiles = map[string]bool{"bearerTokenFile": true, "tokenFile": true, "passwordFile": true}

// ConfineCredentials checks that every credential file cfg names lies
// inside one of dirs, and never in the pod's service-account directory: a
// config editor must not be able to send the bridge's own token (or any
// file it can read) to a URL of their choosing. The check is lexical (a
// clean absolute path, no ".." escape); with resolve, symbolic links are
// also followed for files that exist, so that a link inside an allowed
// directory pointing at the token is refused too (bridge run does so).
//
// What a sink sends (Sent) is also kept apart from what it only uses: such
// a file must not be one the config uses as a key or NATS credentials, and
// its content, where it can be read (validate may run where the files are
// not), must be a single-line token (Sendable), so that a config editor
// cannot send a TLS private key or a NATS seed the bridge only uses.
func ConfineCredentials(cfg *Config, dirs []string, resolve bool) []Problem {
	var problems []Problem
	files := CredentialFiles(cfg)
	used := map[string]string{} // files only used, by clean (and resolved) path: their key path
	for _, cf := range files {
		if !cf.Sent {
			for _, p := range samePaths(cf.File, resolve) {
				used[p] = cf.Path
			}
		}
	}
	for _, cf := range files {
		msg := confine(cf.File, dirs, resolve)
		if msg == "" && cf.Sent {
			msg = sendable(cf.File, used, resolve)
		}
		if msg != "" {
			problems = append(problems, Problem{Path: cf.Path, Line: cfg.LineOf(cf.Path), Message: msg})
		}
	}
	return problems
}

// samePaths are the paths under which file may be named: clean, and, with
// resolve, with its links resolved.
func samePaths(file string, resolve bool) []string {
	out := []string{filepath.Clean(file)}
	if resolve {
		if real, err := filepath.EvalSymlinks(file); err == nil && real != out[0] {
			out = append(out, real)
		}
	}
	return out
}

// maxSentCredential bounds a credential a sink sends (a token, an API key,
// a JWT): more is not a token.
const maxSentCredential = 16 << 10

// sendable is why file may not be sent ("" if it may): it is a file the
// config only uses, or its content is not a token. A file that cannot be
// read is the sink's to report when it opens it.
func sendable(file string, used map[string]string, resolve bool) string {
	for _, p := range samePaths(file, resolve) {
		if key, ok := used[p]; ok {
			return fmt.Sprintf("%s is also %s, which the bridge uses but never sends: a credential a sink sends must be a file of its own", file, key)
		}
	}
	f, err := os.Open(file)
	if err != nil {
		return ""
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxSentCredential+1))
	if err != nil {
		return ""
	}
	if err := Sendable(b); err != nil {
		return fmt.Sprintf("%s %v", file, err)
	}
	return ""
}

var natsSeed = regexp.MustCompile(`^S[UAONCX][A-Z2-7]{56}$`)

// Sendable checks the content of a credential file a sink sends (a bearer
// token, a credentialFiles entry): one line of printable text (surrounding
// white space aside), not a PEM block (a private key, a certificate), not
// NATS credentials or an nkey seed, at most 16 KiB. Such files are for the
// bridge to use, and must not leave it because a config names them as
// something to send. The error reads after the file's name.
func Sendable(content []byte) error {
	b := bytes.TrimSpace(content)
	switch {
	case len(b) > maxSentCredential:
		return fmt.Errorf("is more than %d KiB: a credential a sink sends is a token (an API key), one line", maxSentCredential>>10)
	case bytes.Contains(b, []byte("PRIVATE KEY-----")):
		return errors.New("holds a PEM private key, which the bridge may use (tls.keyFile) but never sends: a credential a sink sends is a token (an API key), one line")
	case bytes.Contains(b, []byte("NKEY SEED")) || bytes.Contains(b, []byte("NATS USER JWT")):
		return errors.New("holds NATS credentials, which the bridge may use (credentialsFile) but never sends: a credential a sink sends is a token (an API key), one line")
	case bytes.Contains(b, []byte("-----BEGIN ")):
		return errors.New("holds a PEM block, which the bridge may use (tls) but never sends: a credential a sink sends is a token (an API key), one line")
	case natsSeed.Match(b):
		return errors.New("holds a NATS nkey seed, which the bridge may use (nkeySeedFile) but never sends: a credential a sink sends is a token (an API key), one line")
	case bytes.ContainsAny(b, "\r\n"):
		return fmt.Errorf("has %d lines: a credential a sink sends is a token (an API key), one line", bytes.Count(b, []byte("\n"))+1)
	case bytes.ContainsFunc(b, func(r rune) bool { return r < 0x20 || r == 0x7f }):
		return errors.New("holds control characters: a credential a sink sends is a token (an API key), one line of text")
	}
	return nil
}

func confine(file string, dirs []string, resolve bool) string {
	allowed := "--credential-dirs: " + strings.Join(dirs, ",")
	if !filepath.IsAbs(file) {
		return fmt.Sprintf("%s is not an absolute path (credential files must be inside an allowed directory, %s)", file, allowed)
	}
	clean := filepath.Clean(file)
	type candidate struct{ path, shown string }
	paths := []candidate{{clean, file}}
	if clean != file {
		paths[0].shown = file + " (that is " + clean + ")"
	}
	if resolve {
		if real, err := filepath.EvalSymlinks(file); err == nil && real != clean {
			paths = append(paths, candidate{real, file + " (a link to " + real + ")"})
		}
	}
	for _, c := range paths {
		for _, f := range forbiddenCredentialDirs {
			if within(c.path, f) {
				return fmt.Sprintf("%s is in the pod's service-account directory (%s): a config may never send the bridge's own credentials", c.shown, f)
			}
		}
		ok := false
		for _, d := range dirs {
			if within(c.path, d) || (resolve && within(c.path, resolved(d))) {
				ok = true
				break
			}
		}
		if !ok {
			return fmt.Sprintf("%s is not inside an allowed credential directory (%s)", c.shown, allowed)
		}
	}
	return ""
}

// within reports whether the clean absolute path p is dir or below it.
func within(p, dir string) bool {
	dir = filepath.Clean(dir)
	return p == dir || strings.HasPrefix(p, strings.TrimSuffix(dir, "/")+"/")
}

func resolved(dir string) string {
	if r, err := filepath.EvalSymlinks(dir); err == nil {
		return r
	}
	return dir
}

// ParseCredentialDirs parses a --credential-dirs value: comma-separated
// absolute directories.
func ParseCredentialDirs(v string) ([]string, error) {
	var dirs []string
	for _, d := range strings.Split(v, ",") {
		d = strings.TrimSpace(d)
		if d == "" {
			continue
		}
		if !filepath.IsAbs(d) {
			return nil, fmt.Errorf("--credential-dirs: %q is not an absolute directory", d)
		}
		dirs = append(dirs, filepath.Clean(d))
	}
	if len(dirs) == 0 {
		return nil, fmt.Errorf("--credential-dirs: no directory given")
	}
	return dirs, nil
}
