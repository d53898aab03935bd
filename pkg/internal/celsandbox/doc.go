// Package celsandbox is the CEL every expression of a config runs in: a
// rule's where and route and a webhook request's templates. It owns the
// declarations (object, oldObject, type; namespaceLabels for routes; event,
// patch and credentials for templates),
// type-checking at load, and the bounds that make an expression from a
// config safe to run on every object: a cost limit per evaluation, 1 MiB
// per string built, and a 16 MiB allocation budget per evaluation enforced
// by guarded calls (docs/security.md). Templates encode their value as
// JSON by construction.
package celsandbox
