package preflight

import (
	"fmt"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/openapi3"
	"k8s.io/kube-openapi/pkg/spec3"

	"github.com/kubebridge/kubebridge/pkg/fieldpath"
)

// checkChanged checks rule i's changed paths against the kind's schema as
// the cluster serves it (OpenAPI v3, so CRDs count): a path that can never
// select anything (a key through a list, a misspelt field) would let no
// update through, silently, so it is an error at changed[j]. A cluster
// whose schema cannot be read is a warning: the paths go unchecked.
func (p *preflight) checkChanged(i int, gvk schema.GroupVersionKind) {
	r := p.cfg.Rules[i]
	if len(r.Changed) == 0 {
		return
	}
	doc, err := p.openAPI(gvk.GroupVersion())
	if err != nil {
		p.warnf(fmt.Sprintf("rules[%d].changed", i), "not checked against the cluster's schema of %s: %v", gvk.Kind, err)
		return
	}
	s, ok := fieldpath.SchemaFor(doc, gvk)
	if !ok {
		return
	}
	for j, c := range r.Changed {
		fp, err := fieldpath.Parse(c)
		if err != nil {
			continue // reported by Load
		}
		if err := s.Check(fp); err != nil {
			p.addf(fmt.Sprintf("rules[%d].changed[%d]", i, j), "%v", err)
		}
	}
}

// openAPI reads (once per preflight) the OpenAPI v3 document of gv.
func (p *preflight) openAPI(gv schema.GroupVersion) (*spec3.OpenAPI, error) {
	if doc, ok := p.schemas[gv]; ok {
		return doc, nil
	}
	if p.openapi == nil {
		p.openapi = openapi3.NewRoot(p.cs.Discovery().OpenAPIV3())
	}
	doc, err := p.openapi.GVSpec(gv)
	if err != nil {
		return nil, err
	}
	p.schemas[gv] = doc
	return doc, nil
}
