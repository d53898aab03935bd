package filters

import (
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/client-go/tools/cache"

	"github.com/kubebridge/kubebridge/pkg/config"
)

// IndexFunc returns the informer index function for a rule index key. The
// informer registers it under key.String(); rules match objects with the
// same function, so a rule's membership test and a replay's ByIndex agree.
func IndexFunc(key config.IndexKey) cache.IndexFunc {
	switch key.Kind {
	case config.IndexNamespace:
		return cache.MetaNamespaceIndexFunc
	case config.IndexLabel, config.IndexAnnotation:
		return func(obj any) ([]string, error) {
			m, err := meta.Accessor(obj)
			if err != nil {
				return nil, err
			}
			values := m.GetLabels()
			if key.Kind == config.IndexAnnotation {
				values = m.GetAnnotations()
			}
			if v, ok := values[key.Arg]; ok {
				return []string{v}, nil
			}
			return nil, nil
		}
	case config.IndexOwner:
		return func(obj any) ([]string, error) {
			m, err := meta.Accessor(obj)
			if err != nil {
				return nil, err
			}
			var names []string
			for _, ref := range m.GetOwnerReferences() {
				if ref.Kind == key.Arg {
					names = append(names, ref.Name)
				}
			}
			return names, nil
		}
	}
	return func(any) ([]string, error) { return nil, nil }
}
