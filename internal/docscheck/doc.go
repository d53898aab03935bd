// Package docscheck holds the test that keeps the repository's Markdown
// links working: every relative link in README.md and docs/ (and the other
// Markdown files of the repository) names a file that exists and, for a
// Markdown file, a heading (GitHub's anchor for it) or an HTML anchor that
// exists. It has no code of its own; `go test ./...` runs the check.
package docscheck
