// Package docscheck holds the tests that keep the repository's Markdown
// links working: every relative link in README.md and docs/ (and the other
// Markdown files of the repository) names a file that exists and, for a
// Markdown file, a heading (GitHub's anchor for it) or an HTML anchor that
// exists; and the layering README.md states: pkg/ imports nothing from
// internal/. It has no code of its own; `go test ./...` runs the checks.
package docscheck
