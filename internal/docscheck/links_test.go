package docscheck

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode"

	"github.com/kubebridge/kubebridge/internal/testenv"
)

// pending are documents being written elsewhere as these links are: a link
// to one is not refused while the file is missing. Once it exists, its
// links and anchors are checked as any other's.
var pending = []string{"docs/mirror.md", "docs/kafka.md"}

// Every relative link in the repository's Markdown resolves: the file (or
// directory) exists, and an anchor names a heading of the Markdown file it
// points into, as GitHub renders it.
func TestMarkdownLinksResolve(t *testing.T) {
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	docs, err := markdownFiles(root)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(docs, "README.md") || !slices.Contains(docs, "docs/sinks.md") {
		t.Fatalf("found %v: not the repository's documents", docs)
	}
	anchors := map[string]map[string]bool{} // by file, relative to root
	anchorsOf := func(file string) (map[string]bool, error) {
		if a, ok := anchors[file]; ok {
			return a, nil
		}
		data, err := os.ReadFile(filepath.Join(root, file))
		if err != nil {
			return nil, err
		}
		anchors[file] = Anchors(string(data))
		return anchors[file], nil
	}
	checked := 0
	for _, doc := range docs {
		data, err := os.ReadFile(filepath.Join(root, doc))
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range Links(string(data)) {
			target, anchor, _ := strings.Cut(l.Target, "#")
			if isExternal(target) {
				continue
			}
			checked++
			file := doc
			if target != "" {
				file = filepath.ToSlash(filepath.Join(filepath.Dir(doc), target))
				if strings.HasPrefix(file, "../") {
					t.Errorf("%s:%d: link %q leaves the repository", doc, l.Line, l.Target)
					continue
				}
				info, err := os.Stat(filepath.Join(root, file))
				if errors.Is(err, fs.ErrNotExist) && slices.Contains(pending, file) {
					continue
				}
				if err != nil {
					t.Errorf("%s:%d: link %q: %s does not exist", doc, l.Line, l.Target, file)
					continue
				}
				if info.IsDir() {
					if anchor != "" {
						t.Errorf("%s:%d: link %q: an anchor into a directory", doc, l.Line, l.Target)
					}
					continue
				}
			}
			if anchor == "" || !strings.HasSuffix(file, ".md") {
				continue // an anchor into code is a line (#L10), not checked
			}
			a, err := anchorsOf(file)
			if err != nil {
				t.Fatal(err)
			}
			if !a[anchor] {
				t.Errorf("%s:%d: link %q: %s has no heading or anchor %q", doc, l.Line, l.Target, file, anchor)
			}
		}
	}
	if checked < 40 {
		t.Errorf("checked %d links: the parser lost some", checked)
	}
}

// markdownFiles lists the Markdown files of the repository, relative to
// root, leaving out hidden directories and what tools and tests keep.
func markdownFiles(root string) ([]string, error) {
	var out []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if path != root && (strings.HasPrefix(name, ".") || name == "testdata" || name == "node_modules" || name == "bin" || name == "dist") {
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(name, ".md") {
			rel, err := filepath.Rel(root, path)
			if err != nil {
				return err
			}
			out = append(out, filepath.ToSlash(rel))
		}
		return nil
	})
	return out, err
}

func isExternal(target string) bool {
	i := strings.IndexByte(target, ':')
	return i > 0 && !strings.ContainsAny(target[:i], "/.") // a scheme: https:, mailto:
}

// Link is a Markdown link's target and the line it is on.
type Link struct {
	Target string
	Line   int
}

var (
	inlineLink = regexp.MustCompile(`\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)`)
	refLink    = regexp.MustCompile(`^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$`)
	codeSpan   = regexp.MustCompile("`+[^`]*`+")
)

// Links returns the links of a Markdown document: inline ones,
// [text](target "title"), and reference definitions, [ref]: target; not
// those in code blocks or code spans.
func Links(doc string) []Link {
	var out []Link
	fence := ""
	for i, line := range strings.Split(doc, "\n") {
		trimmed := strings.TrimSpace(line)
		if fence != "" {
			if strings.HasPrefix(trimmed, fence) {
				fence = ""
			}
			continue
		}
		if strings.HasPrefix(trimmed, "```") || strings.HasPrefix(trimmed, "~~~") {
			fence = trimmed[:3]
			continue
		}
		line = codeSpan.ReplaceAllString(line, "")
		for _, m := range inlineLink.FindAllStringSubmatch(line, -1) {
			out = append(out, Link{Target: m[1], Line: i + 1})
		}
		if m := refLink.FindStringSubmatch(line); m != nil {
			out = append(out, Link{Target: m[1], Line: i + 1})
		}
	}
	return out
}

var htmlAnchor = regexp.MustCompile(`<a\s+(?:id|name)="([^"]+)"`)

// Anchors returns the anchors of a Markdown document as GitHub makes them:
// each heading's slug (lower case; letters, digits, spaces, '-' and '_'
// kept, spaces as '-'; a repeated slug gets -1, -2...), and the id or name
// of HTML anchors.
func Anchors(doc string) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	fence := ""
	for _, line := range strings.Split(doc, "\n") {
		trimmed := strings.TrimSpace(line)
		if fence != "" {
			if strings.HasPrefix(trimmed, fence) {
				fence = ""
			}
			continue
		}
		if strings.HasPrefix(trimmed, "```") || strings.HasPrefix(trimmed, "~~~") {
			fence = trimmed[:3]
			continue
		}
		for _, m := range htmlAnchor.FindAllStringSubmatch(line, -1) {
			out[m[1]] = true
		}
		text, ok := heading(line)
		if !ok {
			continue
		}
		s := Slug(text)
		if n := seen[s]; n > 0 {
			out[fmt.Sprintf("%s-%d", s, n)] = true
		} else {
			out[s] = true
		}
		seen[s]++
	}
	return out
}

// heading returns the text of an ATX heading line ("## Text").
func heading(line string) (string, bool) {
	if len(line) > 3 && strings.HasPrefix(line, "    ") {
		return "", false // indented code
	}
	t := strings.TrimLeft(line, " ")
	n := len(t) - len(strings.TrimLeft(t, "#"))
	if n < 1 || n > 6 || (len(t) > n && t[n] != ' ' && t[n] != '\t') {
		return "", false
	}
	text := strings.TrimSpace(t[n:])
	text = strings.TrimSpace(strings.TrimRight(text, "#")) // closing #s
	return text, true
}

var mdLink = regexp.MustCompile(`\[([^\]]*)\]\([^)]*\)`)

// Slug is GitHub's anchor for a heading's text.
func Slug(text string) string {
	text = mdLink.ReplaceAllString(text, "$1") // a link's text
	var b strings.Builder
	for _, r := range strings.ToLower(text) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

func TestSlug(t *testing.T) {
	for text, want := range map[string]string{
		"Checkpoints and restarts":                           "checkpoints-and-restarts",
		"Fencing: where writes land":                         "fencing-where-writes-land",
		"Protocol `kubebridge.exec/v1`":                      "protocol-kubebridgeexecv1",
		"From a condition to an alert in 5 minutes":          "from-a-condition-to-an-alert-in-5-minutes",
		"Refusing stale writes (fencing tokens)":             "refusing-stale-writes-fencing-tokens",
		"Write one in [Python](../examples/plugins/python)":  "write-one-in-python",
		"Retention: a stream that is a mirror -- and sizing": "retention-a-stream-that-is-a-mirror----and-sizing",
	} {
		if got := Slug(text); got != want {
			t.Errorf("Slug(%q) = %q, want %q", text, got, want)
		}
	}
	a := Anchors("# A\n## Same\n```\n## Not a heading\n```\n## Same\n<a id=\"here\"></a>\n#NoSpace\n")
	for _, want := range []string{"a", "same", "same-1", "here"} {
		if !a[want] {
			t.Errorf("Anchors: no %q in %v", want, a)
		}
	}
	if a["not-a-heading"] || a["nospace"] {
		t.Errorf("Anchors took code or a non-heading: %v", a)
	}
	links := Links("see [a](x.md#y) and `[b](code.md)`\n```\n[c](fenced.md)\n```\n[ref]: ref.md\n[d](<sp ace.md>) [e](f.md \"title\")")
	var got []string
	for _, l := range links {
		got = append(got, l.Target)
	}
	if strings.Join(got, " ") != "x.md#y ref.md f.md" {
		t.Errorf("Links = %v", got)
	}
}
